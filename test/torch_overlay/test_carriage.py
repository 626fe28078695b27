"""How a change to libtorch's code is carried."""

from torch_overlay import carriage


def test_the_stock_symbol_is_derived_from_the_renamed_one():
    assert (
        carriage.find_stock_symbol(
            "_ZN4c10d7Reducer35_overlay_replaced_finalize_backwardEv"
        )
        == "_ZN4c10d7Reducer17finalize_backwardEv"
    )
    # Parameters come through: a change of signature gives a symbol libtorch lacks.
    assert (
        carriage.find_stock_symbol("_ZN4c10d7Reducer29_overlay_replaced_reset_stateEb")
        == "_ZN4c10d7Reducer11reset_stateEb"
    )
