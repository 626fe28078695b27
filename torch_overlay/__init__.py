"""Carries a patch series in patches/BASE onto the released wheel of its base.

series.py reads the series; codegen.py and build.py make the extension from it;
install.py installs, checks and removes the overlay in a torch's site-packages.
testing.py holds what the tests of the overlay and of the scripts share.
"""
