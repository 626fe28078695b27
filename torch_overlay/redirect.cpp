// Redirects the relocations that refer to a function of libtorch.
//
// libtorch is built with -fPIC and GCC's semantic interposition, so a call to
// an exported function, from another library or from libtorch itself, goes
// through the caller's PLT and GOT: a relocation that the dynamic loader
// filled with the function's address (R_*_JUMP_SLOT for a call, R_*_GLOB_DAT
// for an address loaded from the GOT). A virtual function's vtable slot is a
// relocated pointer too (R_*_64). Writing another address into those slots
// makes every such caller reach it, libtorch's own callers included: the
// autograd engine's callback that calls Reducer::finalize_backward(), say.
// torch_overlay/callers.py checks, before the overlay installs, that every
// reference to the function in the wheel's libraries is such a relocation, and
// refuses a function that is called directly.
//
// The loader has filled the slots by the time this runs (or left a lazy PLT
// slot pointing back at the PLT, which is as good to overwrite). Slots in a
// RELRO segment are read-only after relocation: they are made writable for the
// write and read-only again.

#include "redirect.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cctype>
#include <cstdint>
#include <cstring>
#include <utility>

#include <c10/util/Exception.h>

namespace torch_overlay {
namespace {

#if defined(__x86_64__)
constexpr uint32_t kJumpSlot = R_X86_64_JUMP_SLOT;
constexpr uint32_t kGlobDat = R_X86_64_GLOB_DAT;
constexpr uint32_t kData64 = R_X86_64_64;
#elif defined(__aarch64__)
constexpr uint32_t kJumpSlot = R_AARCH64_JUMP_SLOT;
constexpr uint32_t kGlobDat = R_AARCH64_GLOB_DAT;
constexpr uint32_t kData64 = R_AARCH64_ABS64;
#else
#error "torch_overlay redirects relocations on x86_64 and aarch64 only"
#endif

// A loaded library, as dl_iterate_phdr() describes it.
struct Library {
  const dl_phdr_info* info;

  std::string name() const {
    return info->dlpi_name && *info->dlpi_name ? info->dlpi_name
                                               : "the executable";
  }

  // Whether `address` lies in one of its loaded segments.
  bool contains(const void* address) const {
    const auto at = reinterpret_cast<uintptr_t>(address);
    for (int i = 0; i < info->dlpi_phnum; ++i) {
      const auto& segment = info->dlpi_phdr[i];
      const uintptr_t begin = info->dlpi_addr + segment.p_vaddr;
      if (segment.p_type == PT_LOAD && at >= begin &&
          at < begin + segment.p_memsz) {
        return true;
      }
    }
    return false;
  }

  // The protection of the page that holds `slot` once the loader is done.
  int protection_of(uintptr_t slot) const {
    for (int i = 0; i < info->dlpi_phnum; ++i) {
      const auto& segment = info->dlpi_phdr[i];
      const uintptr_t begin = info->dlpi_addr + segment.p_vaddr;
      if (segment.p_type == PT_GNU_RELRO && slot >= begin &&
          slot < begin + segment.p_memsz) {
        return PROT_READ;
      }
    }
    for (int i = 0; i < info->dlpi_phnum; ++i) {
      const auto& segment = info->dlpi_phdr[i];
      const uintptr_t begin = info->dlpi_addr + segment.p_vaddr;
      if (segment.p_type == PT_LOAD && slot >= begin &&
          slot < begin + segment.p_memsz) {
        return ((segment.p_flags & PF_R) ? PROT_READ : 0) |
            ((segment.p_flags & PF_W) ? PROT_WRITE : 0) |
            ((segment.p_flags & PF_X) ? PROT_EXEC : 0);
      }
    }
    TORCH_CHECK(false, "no segment of ", name(), " holds a relocated slot");
  }

  // A pointer of the dynamic section: glibc relocates them in place, other
  // loaders (and the vDSO's) leave the link-time address.
  template <typename T>
  const T* dynamic_pointer(ElfW(Addr) value) const {
    if (value < info->dlpi_addr) {
      value += info->dlpi_addr;
    }
    return reinterpret_cast<const T*>(value);
  }
};

void write_slot(const Library& library, uintptr_t slot, uintptr_t value) {
  static const uintptr_t page_size = sysconf(_SC_PAGESIZE);
  const uintptr_t page = slot & ~(page_size - 1);
  const size_t length = slot + sizeof(void*) - page;
  const int protection = library.protection_of(slot);
  if (!(protection & PROT_WRITE)) {
    TORCH_CHECK(
        mprotect(
            reinterpret_cast<void*>(page), length, PROT_READ | PROT_WRITE) == 0,
        "cannot make a relocated slot of ",
        library.name(),
        " writable: ",
        std::strerror(errno));
  }
  *reinterpret_cast<uintptr_t*>(slot) = value;
  if (!(protection & PROT_WRITE)) {
    TORCH_CHECK(
        mprotect(reinterpret_cast<void*>(page), length, protection) == 0,
        "cannot make a relocated slot of ",
        library.name(),
        " read-only again: ",
        std::strerror(errno));
  }
}

struct Request {
  const std::string& symbol;
  void* replacement;
  std::vector<RedirectedSlots> changed;
};

void redirect_table(
    const Library& library,
    const ElfW(Rela) * table,
    size_t bytes,
    const ElfW(Sym) * symbols,
    const char* names,
    Request& request,
    RedirectedSlots& slots) {
  for (size_t i = 0; i < bytes / sizeof(ElfW(Rela)); ++i) {
    const auto& relocation = table[i];
    const auto type = ELF64_R_TYPE(relocation.r_info);
    const auto index = ELF64_R_SYM(relocation.r_info);
    if (index == 0 ||
        (type != kJumpSlot && type != kGlobDat && type != kData64) ||
        request.symbol != names + symbols[index].st_name) {
      continue;
    }
    auto value = reinterpret_cast<uintptr_t>(request.replacement);
    if (type == kData64) {
      value += relocation.r_addend;
    }
    write_slot(library, library.info->dlpi_addr + relocation.r_offset, value);
    (type == kJumpSlot      ? slots.jump_slots
         : type == kGlobDat ? slots.got_entries
                            : slots.data_pointers) += 1;
  }
}

int redirect_in(dl_phdr_info* info, size_t /*size*/, void* data) {
  auto& request = *static_cast<Request*>(data);
  const Library library{info};
  if (library.contains(request.replacement)) {
    return 0;
  }
  const ElfW(Dyn)* dynamic = nullptr;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    if (info->dlpi_phdr[i].p_type == PT_DYNAMIC) {
      dynamic = reinterpret_cast<const ElfW(Dyn)*>(
          info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    }
  }
  if (dynamic == nullptr) {
    return 0;
  }
  const ElfW(Sym)* symbols = nullptr;
  const char* names = nullptr;
  const ElfW(Rela)* plt = nullptr;
  const ElfW(Rela)* other = nullptr;
  size_t plt_bytes = 0;
  size_t other_bytes = 0;
  for (const auto* entry = dynamic; entry->d_tag != DT_NULL; ++entry) {
    switch (entry->d_tag) {
      case DT_SYMTAB:
        symbols = library.dynamic_pointer<ElfW(Sym)>(entry->d_un.d_ptr);
        break;
      case DT_STRTAB:
        names = library.dynamic_pointer<char>(entry->d_un.d_ptr);
        break;
      case DT_JMPREL:
        plt = library.dynamic_pointer<ElfW(Rela)>(entry->d_un.d_ptr);
        break;
      case DT_PLTRELSZ:
        plt_bytes = entry->d_un.d_val;
        break;
      case DT_RELA:
        other = library.dynamic_pointer<ElfW(Rela)>(entry->d_un.d_ptr);
        break;
      case DT_RELASZ:
        other_bytes = entry->d_un.d_val;
        break;
      case DT_PLTREL:
        TORCH_CHECK(
            entry->d_un.d_val == DT_RELA,
            library.name(),
            " has REL relocations; torch_overlay reads RELA only");
        break;
      default:
        break;
    }
  }
  if (symbols == nullptr || names == nullptr) {
    return 0;
  }
  RedirectedSlots slots{request.symbol, library.name()};
  if (plt != nullptr) {
    redirect_table(library, plt, plt_bytes, symbols, names, request, slots);
  }
  if (other != nullptr) {
    redirect_table(library, other, other_bytes, symbols, names, request, slots);
  }
  if (slots.jump_slots + slots.got_entries + slots.data_pointers > 0) {
    request.changed.push_back(std::move(slots));
  }
  return 0;
}

// A loaded library's name and segments, kept past dl_iterate_phdr(), which
// holds the loader's lock that dlopen() may take.
struct LoadedLibrary {
  std::string name;
  std::vector<std::pair<uintptr_t, uintptr_t>> segments;
};

int list_library(dl_phdr_info* info, size_t /*size*/, void* data) {
  if (!info->dlpi_name || !*info->dlpi_name) {
    return 0;
  }
  LoadedLibrary library{info->dlpi_name, {}};
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const auto& segment = info->dlpi_phdr[i];
    if (segment.p_type == PT_LOAD) {
      const uintptr_t begin = info->dlpi_addr + segment.p_vaddr;
      library.segments.emplace_back(begin, begin + segment.p_memsz);
    }
  }
  static_cast<std::vector<LoadedLibrary>*>(data)->push_back(std::move(library));
  return 0;
}
} // namespace

std::vector<RedirectedSlots> redirect(
    const std::string& symbol,
    void* replacement) {
  Request request{symbol, replacement, {}};
  dl_iterate_phdr(redirect_in, &request);
  return std::move(request.changed);
}

void* find_definition(const std::string& symbol) {
  std::vector<LoadedLibrary> libraries;
  dl_iterate_phdr(list_library, &libraries);
  for (const auto& library : libraries) {
    void* handle = dlopen(library.name.c_str(), RTLD_LAZY | RTLD_NOLOAD);
    if (handle == nullptr) {
      continue;
    }
    void* address = dlsym(handle, symbol.c_str());
    dlclose(handle);
    // dlsym() also searches the library's dependencies: take the library
    // that holds the definition.
    const auto at = reinterpret_cast<uintptr_t>(address);
    for (const auto& [begin, end] : library.segments) {
      if (address != nullptr && at >= begin && at < end) {
        return address;
      }
    }
  }
  return nullptr;
}

std::vector<RedirectedSlots> redirect_changed_function(
    void* patched,
    bool first_line_kept) {
  Dl_info info{};
  TORCH_CHECK(
      dladdr(patched, &info) != 0 && info.dli_sname != nullptr,
      "the overlay's extension does not export a function it compiled");
  // _ZN4c10d7Reducer29_overlay_replaced_reset_stateEv names
  // c10d::Reducer::reset_state() as _ZN4c10d7Reducer11reset_stateEv.
  const std::string renamed = info.dli_sname;
  const std::string prefix = "_overlay_replaced_";
  const auto at = renamed.find(prefix);
  TORCH_CHECK(at != std::string::npos, renamed, " is not a renamed function");
  auto digits = at;
  while (digits > 0 && std::isdigit(renamed[digits - 1])) {
    --digits;
  }
  const auto length = std::stoul(renamed.substr(digits, at - digits));
  const auto name = renamed.substr(at + prefix.size(), length - prefix.size());
  const auto stock = renamed.substr(0, digits) + std::to_string(name.size()) +
      name + renamed.substr(at + length);
  if (!first_line_kept || find_definition(stock) == nullptr) {
    return {};
  }
  return redirect(stock, patched);
}

} // namespace torch_overlay
