// Hostile archives built byte by byte: each check of archive_check.h, zip_archive.h and
// pickle_values.h, and the message that names what is wrong.
#include "graph/archive_check.h"

#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "graph/torch_load.h"
#include "gtest/gtest.h"

namespace torchlens {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

void Put(std::string* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>(value >> (8 * i)));
}

// A zip of stored entries, as torch.save writes it.
std::string Zip(const std::vector<std::pair<std::string, std::string>>& records) {
  std::string out, directory;
  for (const auto& [name, data] : records) {
    const uint64_t local = out.size();
    Put(&out, 0x04034b50, 4);
    Put(&out, 20, 2);  // version needed
    Put(&out, 0, 2);   // flags
    Put(&out, 0, 2);   // stored
    Put(&out, 0, 4);   // time, date
    const uint32_t crc = static_cast<uint32_t>(crc32(crc32(0L, Z_NULL, 0),
                                                     reinterpret_cast<const Bytef*>(data.data()),
                                                     static_cast<uInt>(data.size())));
    Put(&out, crc, 4);
    Put(&out, data.size(), 4);
    Put(&out, data.size(), 4);
    Put(&out, name.size(), 2);
    Put(&out, 0, 2);
    out += name + data;
    Put(&directory, 0x02014b50, 4);
    Put(&directory, 20, 2);
    Put(&directory, 20, 2);
    Put(&directory, 0, 2);
    Put(&directory, 0, 2);
    Put(&directory, 0, 4);
    Put(&directory, crc, 4);
    Put(&directory, data.size(), 4);
    Put(&directory, data.size(), 4);
    Put(&directory, name.size(), 2);
    Put(&directory, 0, 2);  // extra
    Put(&directory, 0, 2);  // comment
    Put(&directory, 0, 2);  // disk
    Put(&directory, 0, 2);  // internal attributes
    Put(&directory, 0, 4);  // external attributes
    Put(&directory, local, 4);
    directory += name;
  }
  const uint64_t directory_offset = out.size();
  out += directory;
  Put(&out, 0x06054b50, 4);
  Put(&out, 0, 4);
  Put(&out, records.size(), 2);
  Put(&out, records.size(), 2);
  Put(&out, directory.size(), 4);
  Put(&out, directory_offset, 4);
  Put(&out, 0, 2);
  return out;
}

// Pickle assembly: each helper returns the opcodes that push one value.
std::string Str(const std::string& s) {
  std::string out = "X";
  Put(&out, s.size(), 4);
  return out + s;
}
std::string Int(int64_t v) {
  if (v >= INT32_MIN && v <= INT32_MAX) {
    std::string out = "J";  // BININT
    Put(&out, static_cast<uint64_t>(v), 4);
    return out;
  }
  std::string out = "\x8a\x08";  // LONG1 of 8 bytes
  Put(&out, static_cast<uint64_t>(v), 8);
  return out;
}
std::string Ints(const std::vector<int64_t>& values) {
  std::string out = "(";
  for (int64_t v : values) out += Int(v);
  return out + "t";
}
// torch._utils._rebuild_tensor_v2 of the float storage data/<key> of `numel` elements.
std::string Tensor(const std::string& key, int64_t numel, int64_t offset,
                   const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  return "ctorch._utils\n_rebuild_tensor_v2\n((" + Str("storage") + "ctorch\nFloatStorage\n" +
         Str(key) + Str("cpu") + Int(numel) + "tQ" + Int(offset) + Ints(sizes) + Ints(strides) +
         "\x89" + "ccollections\nOrderedDict\n)R" + "tR";
}
std::string Program(const std::string& body) { return "\x80\x02" + body + "."; }

std::string FloatRecord(int64_t numel) { return std::string(4 * numel, '\0'); }

std::string SavedTensor(const std::string& tensor, int64_t stored) {
  return Zip({{"archive/data.pkl", Program(tensor)},
              {"archive/data/0", FloatRecord(stored)},
              {"archive/version", "3\n"}});
}

std::string Message(absl::string_view bytes, ArchiveKind kind = ArchiveKind::kTorchSave) {
  absl::StatusOr<CheckedArchive> checked = CheckTorchArchive(bytes, kind);
  EXPECT_EQ(checked.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(checked.status().message());
}

TEST(ArchiveCheckTest, AValidTensorPasses) {
  const std::string bytes = SavedTensor(Tensor("0", 6, 0, {2, 3}, {3, 1}), 6);
  absl::StatusOr<CheckedArchive> checked = CheckTorchArchive(bytes, ArchiveKind::kTorchSave);
  ASSERT_TRUE(checked.ok()) << checked.status();
  ASSERT_EQ(checked->data.tensors.size(), 1u);
  EXPECT_EQ(checked->data.tensors[0].sizes, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(checked->data.tensors[0].strides, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(checked->storage_records.at(0).name, "archive/data/0");
  EXPECT_EQ(checked->tensor_names.at(0), "");
}

// LibTorch's unpickler popped what its stack did not hold: "free(): invalid size" or a
// segfault, in trace files and model archives alike.
TEST(ArchiveCheckTest, OpcodesThatPopAShortStackAreRefused) {
  for (const char* body : {"K\x01\x86", "K\x01K\x02\x87", "K\x01R",
                           "K\x01"
                           "b",
                           "K\x01\x81", "K\x01(\x86", "t",
                           "K\x01"
                           "e",
                           "]K\x01u"}) {
    for (ArchiveKind kind : {ArchiveKind::kTorchSave, ArchiveKind::kTorchScript}) {
      const std::string bytes = Zip({{"m/data.pkl", Program(body)}, {"m/code/__torch__.py", "x"}});
      const std::string message = Message(bytes, kind);
      EXPECT_THAT(message,
                  ::testing::AnyOf(HasSubstr("takes values the stack does not hold"),
                                   HasSubstr("needs a MARK"), HasSubstr("a key without its value")))
          << body;
      EXPECT_THAT(message, HasSubstr("m/data.pkl: pickle opcode 0x")) << body;
    }
  }
}

TEST(ArchiveCheckTest, MemoIdsBeyondThoseStoredAreRefused) {
  // BINPUT 0, then LONG_BINPUT 1000000: LibTorch grows its memo to any id it is given.
  const std::string bytes =
      Zip({{"a/data.pkl", Program(std::string("K\x01q\x00r\x40\x42\x0f\x00", 9))}});
  EXPECT_THAT(Message(bytes), HasSubstr("memo id 1000000 with 1 values memoized"));
  const std::string get = Zip({{"a/data.pkl", Program("h\x05")}});
  EXPECT_THAT(Message(get), HasSubstr("memo id 5 with 0 values memoized"));
}

// The --input crashes (16 MB and 4 GB sizes, offset and stride variants) and the silent
// heap reads of smaller overruns.
TEST(ArchiveCheckTest, TensorsReachingPastTheirStorageAreRefused) {
  struct Case {
    int64_t offset;
    std::vector<int64_t> sizes, strides;
    const char* expected;
  };
  for (const Case& c : std::vector<Case>{
           {0,
            {2048, 2048},
            {2048, 1},
            "reaches element 4194303 of its storage data/0, which holds 6"},
           {0, {65536, 16384}, {16384, 1}, "reaches element 1073741823"},
           {1 << 20, {2, 3}, {3, 1}, "reaches element 1048581"},
           {0, {2, 3}, {1 << 20, 1}, "reaches element 1048578"},
           {0, {2, 4}, {4, 1}, "reaches element 7"},
           {0, {7}, {1}, "(Float, sizes [7], strides [1], offset 0) reaches element 6"},
           {0, {1 << 30, 1 << 30, 1 << 30}, {0, 0, 0}, "more than 2^63 - 1 elements"},
           {0, {1 << 30, 1 << 30}, {1 << 30, 1 << 30}, "reaches element 2305843007066210304"},
           {5, {6}, {-1}, "negative size, stride or offset"},
           {-1, {2}, {1}, "negative size, stride or offset"},
           {0, {2, 3}, {1}, "2 sizes and 1 strides"},
       }) {
    const std::string bytes = SavedTensor(Tensor("0", 6, c.offset, c.sizes, c.strides), 6);
    const std::string message = Message(bytes);
    EXPECT_THAT(message, HasSubstr("the saved tensor")) << c.expected;
    EXPECT_THAT(message, HasSubstr(c.expected));
  }
  // No element read: an empty tensor fits any storage, however large its strides.
  const std::string empty = SavedTensor(Tensor("0", 0, 7, {0, 5}, {1 << 20, 1}), 0);
  EXPECT_TRUE(CheckTorchArchive(empty, ArchiveKind::kTorchSave).ok());
}

// A data/N record cut short: LibTorch made a storage of the claimed size over the shorter
// record's buffer.
TEST(ArchiveCheckTest, StoragesLargerThanTheirRecordsAreRefused) {
  EXPECT_THAT(Message(SavedTensor(Tensor("0", 1 << 20, 0, {6}, {1}), 6)),
              HasSubstr("storage data/0 of the saved tensor claims 1048576 Float elements "
                        "(4194304 bytes), but its record holds 24 bytes (truncated?)"));
  EXPECT_THAT(Message(SavedTensor(Tensor("7", 6, 0, {6}, {1}), 6)),
              HasSubstr("storage data/7 of the saved tensor has no record in the archive"));
  EXPECT_THAT(Message(SavedTensor(Tensor("0", int64_t{1} << 62, 0, {6}, {1}), 6)),
              HasSubstr("claims 4611686018427387904 Float elements (2^64 or more bytes)"));
}

// Errors name the tensor where it sits: a module's parameter in a TorchScript archive, an
// element of a saved list.
TEST(ArchiveCheckTest, TensorsAreNamedByWhereTheySit) {
  // Net() with state {"fc": Linear() with state {"weight": <tensor>}}.
  const std::string bad_weight = Tensor("0", 4, 0, {2, 4}, {4, 1});
  const std::string module = "c__torch__\nNet\n)\x81}(" + Str("fc") +
                             "c__torch__\nLinear\n)\x81}(" + Str("weight") + bad_weight + "ub" +
                             "ub";
  const std::string archive = Zip({{"net/data.pkl", Program(module)},
                                   {"net/data/0", FloatRecord(4)},
                                   {"net/code/__torch__.py", "class Net: pass\n"},
                                   {"net/constants.pkl", Program(")")}});
  EXPECT_THAT(
      Message(archive, ArchiveKind::kTorchScript),
      HasSubstr("net/data.pkl: tensor 'fc.weight' (Float, sizes [2, 4], strides [4, 1], "
                "offset 0) reaches element 7 of its storage data/0, which holds 4 elements"));
  // torch.save data holds no objects.
  EXPECT_THAT(Message(archive, ArchiveKind::kTorchSave), HasSubstr("an object of __torch__.Net"));

  const std::string list = "](" + Tensor("0", 6, 0, {6}, {1}) + Tensor("0", 6, 0, {3}, {3}) + "e";
  EXPECT_THAT(Message(SavedTensor(list, 6)), HasSubstr("tensor '[1]'"));
  const std::string dict = "}(" + Str("x") + Tensor("0", 6, 0, {9}, {1}) + "u";
  EXPECT_THAT(Message(SavedTensor(dict, 6)), HasSubstr("tensor '['x']'"));
}

TEST(ArchiveCheckTest, ConstantsAndDebugInformationAreCheckedToo) {
  auto script = [](const std::string& constants, const std::string& debug) {
    return Zip({{"m/data.pkl", Program("N")},
                {"m/version", "3\n"},
                {"m/constants.pkl", Program(constants)},
                {"m/constants/0", FloatRecord(2)},
                {"m/code/__torch__.py", "x"},
                {"m/code/__torch__.py.debug_pkl", Program(debug)}});
  };
  EXPECT_TRUE(CheckTorchArchive(script("(" + Tensor("0", 2, 0, {2}, {1}) + "t", ")"),
                                ArchiveKind::kTorchScript)
                  .ok());
  EXPECT_THAT(
      Message(script("(" + Tensor("0", 2, 0, {3}, {1}) + "t", ")"), ArchiveKind::kTorchScript),
      HasSubstr("m/constants.pkl: tensor '[0]'"));
  EXPECT_THAT(Message(script(")", "K\x01\x86"), ArchiveKind::kTorchScript),
              HasSubstr("m/code/__torch__.py.debug_pkl: pickle opcode 0x86"));
  // A torch.save file given as a model: no code. A state dict's OrderedDict is said to be
  // that too, not an opcode LibTorch's TorchScript unpickler does not read.
  EXPECT_THAT(Message(SavedTensor(Tensor("0", 6, 0, {6}, {1}), 6), ArchiveKind::kTorchScript),
              HasSubstr("it holds no code"));
  EXPECT_THAT(Message(Zip({{"a/data.pkl", Program("ccollections\nOrderedDict\n)R")}}),
                      ArchiveKind::kTorchScript),
              HasSubstr("it holds no code"));
  // torch.save's legacy format is a bare pickle: said so, not "truncated?".
  EXPECT_THAT(Message(Program("K\x01") + std::string(30, ' ')),
              HasSubstr("a bare pickle, not a zip archive: torch.save's legacy format"));
}

// LibTorch's reader throws from its constructor, leaking itself, without a format version
// it supports.
TEST(ArchiveCheckTest, ModelArchivesNeedAFormatVersionLibTorchReads) {
  auto script = [](const std::string& name, const std::string& version) {
    return Zip({{"m/data.pkl", Program("N")}, {name, version}, {"m/code/__torch__.py", "x"}});
  };
  EXPECT_TRUE(CheckTorchArchive(script("m/version", "3\n"), ArchiveKind::kTorchScript).ok());
  EXPECT_TRUE(CheckTorchArchive(script("m/.data/version", "10"), ArchiveKind::kTorchScript).ok());
  EXPECT_THAT(Message(script("m/other", "3"), ArchiveKind::kTorchScript),
              HasSubstr("no record m/version (the archive's format version)"));
  EXPECT_THAT(Message(script("m/version", "x3"), ArchiveKind::kTorchScript),
              HasSubstr("record m/version holds \"x3\", not a format version LibTorch 1.13 "
                        "reads (1 to 10)"));
  EXPECT_THAT(Message(script("m/version", "11"), ArchiveKind::kTorchScript),
              HasSubstr("(1 to 10)"));
  // torch.save data does not go to LibTorch's reader.
  EXPECT_TRUE(CheckTorchArchive(Zip({{"m/data.pkl", Program("N")}}), ArchiveKind::kTorchSave).ok());
}

// NOTE [Debug information]: LibTorch reads it inside a noexcept function, unchecked.
TEST(ArchiveCheckTest, DebugInformationMustHaveLibTorchsForm) {
  auto script = [](const std::string& debug) {
    return Zip({{"m/data.pkl", Program("N")},
                {"m/version", "3\n"},
                {"m/code/__torch__.py", "x"},
                {"m/code/__torch__.py.debug_pkl", Program(debug)}});
  };
  const std::string table = "(" + Str("") + Str("def f(x):\n") + Str("f.py") + "t";
  auto range = [](const std::string& pieces, int64_t file) {
    return "ctorch.jit._pickle\nbuild_intlist\n(](" + pieces + "etR" + Int(file) + Int(1) + "\x87" +
           Int(0) + Int(3) + "\x87";
  };
  auto lines = [](const std::string& one_range) {
    return "((" + Int(10) + one_range + Int(0) + "ttt";
  };
  // ("FORMAT_WITH_STRING_TABLE", table, ((10, range, 0),)): as LibTorch writes it.
  const std::string good = "(" + Str("FORMAT_WITH_STRING_TABLE") + table + lines(range(Int(1), 2));
  ASSERT_TRUE(CheckTorchArchive(script(good), ArchiveKind::kTorchScript).ok());
  EXPECT_THAT(
      Message(script("(" + Str("FORMAT_WITH_STRING_TABLE") + table + lines(range(Int(7), 2))),
              ArchiveKind::kTorchScript),
      HasSubstr("m/code/__torch__.py.debug_pkl: debug information LibTorch cannot read "
                "safely: a text index out of range"));
  EXPECT_THAT(
      Message(script("(" + Str("FORMAT_WITH_STRING_TABLE") + table + lines(range(Int(1), 9))),
              ArchiveKind::kTorchScript),
      HasSubstr("a malformed source"));
  // A global LibTorch does not know (it throws), and an opcode it does not read.
  EXPECT_THAT(Message(script("ctorch.jit._pickle\nbpsld_intlist\n)R"), ArchiveKind::kTorchScript),
              HasSubstr("values other than tuples, lists of ints, strings and ints"));
  EXPECT_THAT(Message(script("]K\x01"
                             "a"),
                      ArchiveKind::kTorchScript),
              HasSubstr("an opcode LibTorch 1.13's unpickler does not read"));
}

// LibTorch walks loaded values recursively: a list holding itself, or a chain of lists
// deeper than the recorded depths say, would overflow its stack.
TEST(ArchiveCheckTest, ValuesThatContainThemselvesOrNestTooDeeplyAreRefused) {
  // EMPTY_LIST, BINPUT 0, BINGET 0, APPEND: the list holds itself.
  EXPECT_THAT(Message(Zip({{"a/data.pkl", Program(std::string("]q\x00h\x00"
                                                              "a",
                                                              6))}})),
              HasSubstr("contains itself"));
  // 12,000 nested lists: ']' x 12000, then APPEND x 11999.
  const std::string deep = std::string(12000, ']') + std::string(11999, 'a');
  EXPECT_THAT(Message(Zip({{"a/data.pkl", Program(deep)}})),
              HasSubstr("values nest deeper than 1000 levels"));
  // A chain built outside in, whose recorded depths stay small: lists 0..11999 memoized,
  // then each appended into the one before it.
  std::string chain;
  for (uint32_t i = 0; i < 12000; ++i) {
    chain += "]r";
    Put(&chain, i, 4);
    chain += "0";  // POP
  }
  chain += "j";
  Put(&chain, 0, 4);
  for (uint32_t i = 0; i + 1 < 12000; ++i) {
    chain += "j";
    Put(&chain, i, 4);
    chain += "j";
    Put(&chain, i + 1, 4);
    chain += "a0";  // APPEND, POP
  }
  EXPECT_THAT(Message(Zip({{"a/data.pkl", Program(chain)}})),
              HasSubstr("values nest deeper than 1000 levels"));
}

// NOTE [Pickle nesting by file kind]: a model archive's modules nest one pickle level each,
// as deep as LibTorch's pickler writes them; a torch.save file is bounded as Python's
// pickler is.
TEST(ArchiveCheckTest, ModelArchivesNestAsDeepAsTheirModules) {
  auto nested = [](int levels) {
    // (EMPTY_LIST, MARK) x (levels - 1), EMPTY_LIST, APPENDS x (levels - 1): lists
    // `levels` deep, in the opcodes LibTorch's unpickler reads.
    std::string program;
    for (int i = 1; i < levels; ++i) program += "](";
    return Program(program + "]" + std::string(levels - 1, 'e'));
  };
  auto script = [&](int levels) {
    return Zip(
        {{"m/data.pkl", nested(levels)}, {"m/version", "3\n"}, {"m/code/__torch__.py", "x"}});
  };
  for (int levels : {1001, 2500, 8192}) {
    absl::StatusOr<CheckedArchive> checked =
        CheckTorchArchive(script(levels), ArchiveKind::kTorchScript);
    EXPECT_TRUE(checked.ok()) << levels << ": " << checked.status();
  }
  EXPECT_THAT(Message(script(8193), ArchiveKind::kTorchScript),
              HasSubstr("values nest deeper than 8192 levels"));
  EXPECT_THAT(Message(Zip({{"a/data.pkl", nested(1001)}})),
              HasSubstr("values nest deeper than 1000 levels"));
}

// Shared containers are one value each in memory, but every walk after loading (the
// capture marking its inputs, a replay mapping arguments) follows each path: `x = [x, x]`
// sixty times over, 400 bytes of pickle, is 2^61 elements (helper probe, session 12: the
// capture never ended). Sharing that stays small is fine.
TEST(ArchiveCheckTest, SharedContainersThatExpandPastTheLimitAreRefused) {
  auto doubled = [](int times) {
    // EMPTY_LIST, BINPUT 0; then `times` x (POP, EMPTY_LIST, MARK, BINGET 0, BINGET 0,
    // APPENDS, BINPUT 0).
    std::string program("]q\x00", 3);
    for (int i = 0; i < times; ++i)
      program += std::string(
          "0](h\x00h\x00"
          "eq\x00",
          10);
    return program;
  };
  EXPECT_THAT(Message(Zip({{"a/data.pkl", Program(doubled(60))}})),
              AllOf(HasSubstr("more than 67108864 elements"), HasSubstr("shared containers")));
  // 2^20 elements once expanded: loads.
  absl::StatusOr<CheckedArchive> small =
      CheckTorchArchive(Zip({{"a/data.pkl", Program(doubled(19))}}), ArchiveKind::kTorchSave);
  EXPECT_TRUE(small.ok()) << small.status();
}

// LibTorch's reader finds records without regard to case: a debug record in "M/" is read as
// one of "m/", so a check must see it (fuzzing: seed case_folded_folder.pt ended the
// process through an unknown global in such a record), and names equal but for case are one.
TEST(ArchiveCheckTest, NamesAreComparedWithoutRegardToCaseAsLibTorchDoes) {
  const std::string folded =
      Zip({{"m/data.pkl", Program("N")},
           {"m/version", "3"},
           {"m/code/__torch__.py", "x"},
           {"M/code/__torch__.py.debug_pkl", Program("ctorch.jit._pickle\nbpsld_intlist\n)R")}});
  EXPECT_THAT(Message(folded, ArchiveKind::kTorchScript),
              HasSubstr("zip entry M/code/__torch__.py.debug_pkl lies in a folder that differs "
                        "from the archive's folder m/ only in case"));
  const std::string twice = Zip({{"m/data.pkl", Program("N")},
                                 {"m/version", "3"},
                                 {"m/VERSION", "99"},
                                 {"m/code/__torch__.py", "x"}});
  EXPECT_THAT(Message(twice, ArchiveKind::kTorchScript),
              HasSubstr("zip entry m/VERSION appears twice"));
  // Another folder altogether is not LibTorch's to read, and stays allowed.
  EXPECT_TRUE(CheckTorchArchive(Zip({{"m/data.pkl", Program("N")},
                                     {"m/version", "3"},
                                     {"m/code/__torch__.py", "x"},
                                     {"other/notes.txt", "x"}}),
                                ArchiveKind::kTorchScript)
                  .ok());
}

// The records LibTorch runs besides data.pkl are checked under any case of their names,
// since its reader finds "constants.pkl" as "CONSTANTS.pkl" (fuzzing, 2026-12-02: a code
// record under "coDe/" escaped the code check the same way).
TEST(ArchiveCheckTest, RecordsAreSelectedWithoutRegardToCaseAsLibTorchFindsThem) {
  const std::string debug = Zip({{"m/data.pkl", Program("N")},
                                 {"m/version", "3"},
                                 {"m/code/__torch__.py", "x"},
                                 {"m/CODE/__torch__.py.DEBUG_PKL", Program("a")}});
  EXPECT_THAT(Message(debug, ArchiveKind::kTorchScript),
              HasSubstr("m/CODE/__torch__.py.DEBUG_PKL: pickle opcode 0x61 at byte 2"));
  const std::string constants = Zip({{"m/data.pkl", Program("N")},
                                     {"m/version", "3"},
                                     {"m/code/__torch__.py", "x"},
                                     {"m/Constants.PKL", Program("a")}});
  EXPECT_THAT(Message(constants, ArchiveKind::kTorchScript),
              HasSubstr("m/Constants.PKL: pickle opcode 0x61 at byte 2"));
  // The same archives with well-formed records load.
  EXPECT_TRUE(CheckTorchArchive(Zip({{"m/data.pkl", Program("N")},
                                     {"m/version", "3"},
                                     {"m/Code/__torch__.py", "x"},
                                     {"m/CODE/__torch__.py.DEBUG_PKL", Program(")")},
                                     {"m/Constants.PKL", Program(")")}}),
                                ArchiveKind::kTorchScript)
                  .ok());
}

TEST(ArchiveCheckTest, ScriptRecordKindIgnoresCase) {
  EXPECT_EQ(ScriptRecordKind("code/__torch__.py"), ScriptRecord::kCode);
  EXPECT_EQ(ScriptRecordKind("coDe/__torch__/m.PY"), ScriptRecord::kCode);
  EXPECT_EQ(ScriptRecordKind("CODE/__torch__.py.Debug_Pkl"), ScriptRecord::kDebugInfo);
  EXPECT_EQ(ScriptRecordKind("Constants.PKL"), ScriptRecord::kConstants);
  EXPECT_EQ(ScriptRecordKind("code/constants.pkl"), ScriptRecord::kOther);
  EXPECT_EQ(ScriptRecordKind("data/0"), ScriptRecord::kOther);
  EXPECT_EQ(ScriptRecordKind("code/__torch__.pyc"), ScriptRecord::kOther);
  EXPECT_EQ(ScriptRecordKind("xcode/__torch__.py"), ScriptRecord::kOther);
  EXPECT_TRUE(InCodeFolder("Code/anything"));
  EXPECT_FALSE(InCodeFolder("data.pkl"));
}

// LibTorch's reader hands out uninitialized bytes for a record that fails its CRC; a
// debug record read that way ended the process (fuzzing, corpus seed crc_debug_record.pt).
TEST(ArchiveCheckTest, EntriesThatFailTheirCrcAreRefused) {
  const std::string good = Zip({{"m/data.pkl", Program("N")},
                                {"m/version", "3"},
                                {"m/code/__torch__.py", "x"},
                                {"m/data/0", FloatRecord(2)}});
  ASSERT_TRUE(CheckTorchArchive(good, ArchiveKind::kTorchScript).ok());
  std::string bad = good;
  const size_t record = bad.find("m/data/0") + 8;  // the record's first byte
  bad[record] = static_cast<char>(bad[record] ^ 1);
  EXPECT_THAT(Message(bad, ArchiveKind::kTorchScript),
              HasSubstr("zip entry m/data/0 fails its CRC-32 check"));
  // torch.save data is read by torchlens, as it is.
  EXPECT_TRUE(CheckTorchArchive(bad, ArchiveKind::kTorchSave).ok());
}

// LibTorch's reader (miniz) takes an entry whose external attributes carry the DOS directory
// bit for a directory, and reads no bytes into the record it hands out: a debug record
// marked so ended the process (fuzzing, 2026-12-02: one byte of the attributes changed).
TEST(ArchiveCheckTest, FilesMarkedAsDirectoriesAreRefused) {
  const std::string good = Zip({{"m/data.pkl", Program("N")},
                                {"m/version", "3"},
                                {"m/code/__torch__.py", "x"},
                                {"m/code/__torch__.py.debug_pkl", Program(")")}});
  ASSERT_TRUE(CheckTorchArchive(good, ArchiveKind::kTorchScript).ok());
  std::string marked = good;
  const size_t entry = marked.rfind("PK\x01\x02");  // the debug record's directory entry
  ASSERT_NE(entry, std::string::npos);
  marked[entry + 38] = '\x7a';  // external attributes: 0x7a has the directory bit 0x10
  EXPECT_THAT(Message(marked, ArchiveKind::kTorchScript),
              HasSubstr("zip entry m/code/__torch__.py.debug_pkl is named as a file but "
                        "marked as a directory (external attributes 0x7a)"));
  marked[entry + 38] = '\x6a';  // the same bits without the directory bit
  EXPECT_TRUE(CheckTorchArchive(marked, ArchiveKind::kTorchScript).ok());
  // A directory entry named as one, as `zip -r` writes, is not a record and stays allowed.
  std::string with_folder = Zip({{"m/data.pkl", Program("N")},
                                 {"m/version", "3"},
                                 {"m/code/", ""},
                                 {"m/code/__torch__.py", "x"}});
  with_folder[with_folder.find("PK\x01\x02") + 46 * 2 + 10 + 9 + 38] = '\x10';
  EXPECT_TRUE(CheckTorchArchive(with_folder, ArchiveKind::kTorchScript).ok());
}

TEST(ArchiveCheckTest, ZipDirectoriesThatLieAreRefused) {
  const std::string good = SavedTensor(Tensor("0", 6, 0, {6}, {1}), 6);
  ASSERT_TRUE(CheckTorchArchive(good, ArchiveKind::kTorchSave).ok());
  EXPECT_THAT(Message(good.substr(0, good.size() - 30)), HasSubstr("end-of-directory"));
  EXPECT_THAT(Message(Zip({{"a/data.pkl", Program("N")}, {"a/data.pkl", Program("N")}})),
              HasSubstr("zip entry a/data.pkl appears twice"));
  EXPECT_THAT(Message(Zip({{"data.pkl", Program("N")}})), HasSubstr("is not in a directory"));
  EXPECT_THAT(Message(Zip({{"a/version", "3\n"}})), HasSubstr("no record a/data.pkl"));
  // A stored entry that claims more bytes than follow it.
  std::string long_entry = good;
  const size_t directory = long_entry.find("PK\x01\x02");
  ASSERT_NE(directory, std::string::npos);
  long_entry[directory + 23] = '\x7f';  // the directory's sizes, not the local header's, count
  long_entry[directory + 27] = '\x7f';
  EXPECT_THAT(Message(long_entry), HasSubstr("bytes past the end"));
}

}  // namespace
}  // namespace torchlens

namespace torchlens {
namespace {

// restore_type_tag(list, tag), the way TorchScript's pickler types a list.
std::string Tagged(const std::string& list, const std::string& tag) {
  return "ctorch.jit._pickle\nrestore_type_tag\n(" + list + Str(tag) + "tR";
}

std::string Saved(const std::string& body) {
  return Zip({{"archive/data.pkl", Program(body)}, {"archive/version", "3\n"}});
}

// Helper review, 2026-12-06. LibTorch's type parser recurses once per bracket: a tag of
// 200,000 "List[" overflowed the stack when the list was built (a crash, not a status).
TEST(ArchiveCheckTest, TypeTagsNoTypeHasAreRefusedBeforeAnythingParsesThem) {
  std::string deep;
  for (int i = 0; i < 200000; ++i) deep += "List[";
  deep += "int";
  deep += std::string(200000, ']');
  EXPECT_THAT(Message(Saved(Tagged("]", deep))),
              HasSubstr("a type tag that no TorchScript type has (1200003 characters"));
  EXPECT_THAT(Message(Saved(Tagged("]", std::string(33, '[') + std::string(33, ']')))),
              HasSubstr("nested at most 32 deep"));
  EXPECT_THAT(Message(Saved(Tagged("]", "List[int]]"))), HasSubstr("a type tag that no"));
  EXPECT_TRUE(CheckTorchArchive(Saved(Tagged("]", "Dict[str, List[Tuple[Tensor, int]]]")),
                                ArchiveKind::kTorchSave)
                  .ok());
}

std::string Float(double value) {  // BINFLOAT: big-endian IEEE double
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  std::string out = "G";
  for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>(bits >> (8 * i)));
  return out;
}

// _rebuild_qtensor of one QInt8 element of storage data/0 with `quantizer`.
std::string QTensor(const std::string& quantizer) {
  return "ctorch._utils\n_rebuild_qtensor\n((" + Str("storage") + "ctorch\nQInt8Storage\n" +
         Str("0") + Str("cpu") + Int(1) + "tQ" + Int(0) + Ints({1}) + Ints({1}) + quantizer +
         "\x89" + "ccollections\nOrderedDict\n)R" + "tR";
}

// Helper review, 2026-12-06: per-channel scales that are themselves quantized tensors,
// chained, made building the value recurse once per link (50,000 links in 2 MB overflowed
// the stack). A quantizer's parameters are plain tensors.
TEST(ArchiveCheckTest, QuantizersHoldingQuantizedTensorsAreRefused) {
  const std::string per_tensor = "(ctorch\nper_tensor_affine\n" + Float(0.5) + Int(0) + "t";
  const std::string plain = Zip({{"archive/data.pkl", Program(QTensor(per_tensor))},
                                 {"archive/data/0", std::string(1, '\0')},
                                 {"archive/version", "3\n"}});
  ASSERT_TRUE(CheckTorchArchive(plain, ArchiveKind::kTorchSave).ok());
  const std::string chained =
      "(ctorch\nper_channel_affine\n" + QTensor(per_tensor) + QTensor(per_tensor) + Int(0) + "t";
  EXPECT_THAT(Message(Zip({{"archive/data.pkl", Program(QTensor(chained))},
                           {"archive/data/0", std::string(1, '\0')},
                           {"archive/version", "3\n"}})),
              HasSubstr("torch._utils._rebuild_qtensor whose quantizer holds a quantized tensor"));
}

// Helper review, 2026-12-06: directory entries naming one record's bytes multiply what a
// small file inflates to (2,000 entries over one 64 MB deflated record of zeros: a 300 KB
// file, 128 GB). Every zip writer gives each entry bytes of its own.
TEST(ArchiveCheckTest, EntriesSharingBytesAreRefused) {
  const std::string good = Zip({{"a/data.pkl", Program("N")}, {"a/version", "3\n"}});
  ASSERT_TRUE(CheckTorchArchive(good, ArchiveKind::kTorchSave).ok());
  std::string shared = good;
  const size_t second = shared.rfind("PK\x01\x02");  // a/version's directory entry
  ASSERT_NE(second, std::string::npos);
  for (int i = 0; i < 4; ++i) shared[second + 42 + i] = '\0';  // its local header: a/data.pkl's
  EXPECT_THAT(Message(shared), HasSubstr("two zip entries share the bytes at offset 0"));
}

}  // namespace
}  // namespace torchlens

namespace torchlens {
namespace {

// What the archive check lets through, LoadPickled builds only when the tag names a type
// and the elements have it: LibTorch's parser returns null for "Union" (a null dereference
// before), and a List[str] of ints would reach kernels as strings.
TEST(ArchiveCheckTest, ListsAreBuiltOnlyAsTheTypeTheirTagNames) {
  absl::StatusOr<c10::IValue> ints =
      LoadPickled(Saved(Tagged("](" + Int(1) + Int(2) + "e", "List[int]")));
  ASSERT_TRUE(ints.ok()) << ints.status();
  EXPECT_EQ(ints->toIntVector(), (std::vector<int64_t>{1, 2}));
  absl::StatusOr<c10::IValue> union_tag = LoadPickled(Saved(Tagged("]", "Union")));
  EXPECT_EQ(union_tag.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(union_tag.status().message()),
              HasSubstr("tagged with the unknown type 'Union'"));
  absl::StatusOr<c10::IValue> lying = LoadPickled(Saved(Tagged("](" + Int(1) + "e", "List[str]")));
  EXPECT_EQ(lying.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(lying.status().message()),
              HasSubstr("tagged 'List[str]' but holds a value of type int"));
}

}  // namespace
}  // namespace torchlens

namespace torchlens {
namespace {

// Helper review, 2026-12-06: an input of stride-0 dimensions claims elements its one stored
// float does not hold, and the tool copies its inputs (a few bytes claiming 2^32 elements
// were 16 GB). Past 2^31 elements, inputs must hold what they claim.
TEST(ArchiveCheckTest, ExpandedInputsPastTwoToThe31ElementsAreRefused) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/expanded.pt");
  auto write = [&](int64_t rows) {
    std::ofstream(path, std::ios::binary)
        << SavedTensor(Tensor("0", 1, 0, {rows, 65536}, {0, 0}), 1);
  };
  write(65536);  // 2^32 elements on one float
  absl::StatusOr<std::vector<c10::IValue>> refused = LoadInputs(path);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("holds a tensor of shape [65536, 65536] on 4 bytes (an expanded "
                        "tensor): more than 2^31 elements"));
  write(2);  // an expanded input of 131,072 elements loads, expanded
  absl::StatusOr<std::vector<c10::IValue>> loaded = LoadInputs(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)[0].toTensor().sizes(), at::IntArrayRef({2, 65536}));
  EXPECT_EQ((*loaded)[0].toTensor().strides(), at::IntArrayRef({0, 0}));
}

}  // namespace
}  // namespace torchlens
