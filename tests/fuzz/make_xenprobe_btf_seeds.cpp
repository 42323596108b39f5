// Writes the seeds of the xenprobe_btf fuzz target (tests/fuzz/corpus/xenprobe_btf/): the xenprobe
// tests' BTF (tests/xenprobe/btf_types.c, compiled by the build) raw, then with a module's split
// BTF on top. Not built by the project; run once by hand:
//   g++ -std=c++20 tests/fuzz/make_xenprobe_btf_seeds.cpp -o /tmp/seedgen -lbpf
//   /tmp/seedgen build/tests/xenprobe/btf_types.o tests/fuzz/corpus/xenprobe_btf
#include <bpf/btf.h>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <vector>
int main(int argc, char** argv) {
  btf* k = btf__parse_elf(argv[1], nullptr);
  if (!k) return 1;
  __u32 n = 0;
  const void* raw = btf__raw_data(k, &n);
  std::vector<char> kr((const char*)raw, (const char*)raw + n);
  {
    std::ofstream o(std::string(argv[2]) + "/kernel_only", std::ios::binary);
    o.write((const char*)&n, 4);
    o.write(kr.data(), kr.size());
  }
  btf* base = btf__new(kr.data(), n);
  btf* s = btf__new_empty_split(base);
  int u32 = btf__find_by_name_kind(base, "unsigned int", BTF_KIND_INT);
  int file = btf__find_by_name_kind(base, "file", BTF_KIND_STRUCT);
  int u64 = btf__add_int(s, "long long unsigned int", 8, 0);
  int ptr = btf__add_ptr(s, file > 0 ? file : u64);
  btf__add_struct(s, "mod_inode", 24);
  btf__add_field(s, "i_ino", u64, 0, 0);
  btf__add_field(s, "i_flags", u32 > 0 ? u32 : u64, 64, 0);
  btf__add_field(s, "i_file", ptr, 128, 0);
  __u32 sn = 0;
  const void* sraw = btf__raw_data(s, &sn);
  std::ofstream o(std::string(argv[2]) + "/kernel_and_module", std::ios::binary);
  o.write((const char*)&n, 4);
  o.write(kr.data(), kr.size());
  o.write((const char*)sraw, sn);
  std::printf("kernel %u bytes, module %u bytes, file=%d u32=%d\n", n, sn, file, u32);
}
