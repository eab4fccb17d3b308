// GGUF reader: parsing and validation. See include/bonsai/gguf.h for the format.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "bonsai/error.h"
#include "bonsai/gguf.h"
#include "mapped_file.h"

namespace bonsai {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint32_t kMaxDims = 4;
constexpr int kMaxArrayDepth = 8;

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  while (i < s.size()) {
    unsigned c = p[i];
    size_t n;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    }
    if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else
      return false;
    if (i + n >= s.size()) return false;  // continuation bytes run past the end
    for (size_t k = 1; k <= n; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += n + 1;
  }
  return true;
}

// A key or tensor name as it appears in an error message: control bytes are
// escaped (a name may legally hold '\n', and the CLI promises one error
// line), so are all non-ASCII bytes of a name that is not valid UTF-8, and
// very long names are shortened.
std::string printable(std::string_view s) {
  constexpr size_t kMax = 120;
  const bool utf8 = valid_utf8(s);
  std::string out;
  for (size_t i = 0; i < s.size() && i < kMax; ++i) {
    const auto ch = static_cast<unsigned char>(s[i]);
    if (ch < 0x20 || ch == 0x7F || (ch >= 0x80 && !utf8))
      out += fmt::format("\\x{:02x}", ch);
    else
      out += static_cast<char>(ch);
  }
  if (s.size() > kMax) out += fmt::format("...({} bytes)", s.size());
  return out;
}

// What a read is for, formatted only when the read fails:
// "magic", "metadata key #3", "key 'general.name' value", "tensor 'x' shape".
struct Where {
  const char* kind;       // "key" / "tensor", or nullptr for a header field
  std::string_view name;  // key or tensor name; empty: use index
  uint64_t index;
  const char* field;
  std::string str() const {
    if (!kind) return field;
    if (name.empty()) return fmt::format("{} #{} {}", kind, index, field);
    return fmt::format("{} '{}' {}", kind, printable(name), field);
  }
};
Where header_field(const char* field) { return {nullptr, {}, 0, field}; }

// Bounds-checked little-endian reader over the mapping.
class Cursor {
 public:
  Cursor(const uint8_t* base, uint64_t size, const std::string& path)
      : base_(base), size_(size), path_(path) {}
  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  void need(uint64_t n, const Where& w) const {
    if (n > remaining())
      fail("{}: truncated while reading {} (need {} bytes at offset {}, file has {})", path_, w.str(), n,
           pos_, size_);
  }
  template <typename T>
  T read(const Where& w) {
    need(sizeof(T), w);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string_view read_string(const Where& w) {
    uint64_t n = read<uint64_t>(w);
    need(n, w);
    std::string_view s(reinterpret_cast<const char*>(base_ + pos_), n);
    pos_ += n;
    return s;
  }
  const uint8_t* take(uint64_t n, const Where& w) {
    need(n, w);
    const uint8_t* p = base_ + pos_;
    pos_ += n;
    return p;
  }

 private:
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& path_;
};

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

// Reads one value of `type` (the type tag already consumed). Arrays nest up
// to kMaxArrayDepth; every count is checked against the bytes that remain
// before anything is reserved, so a corrupt count cannot allocate.
GgufValue read_value(Cursor& c, GgufType type, const std::string& path, std::string_view key, int depth) {
  const Where w{"key", key, 0, "value"};
  auto bad = [&](std::string_view what) { fail("{}: key '{}': {}", path, printable(key), what); };
  GgufValue v;
  v.type = type;
  switch (type) {
    case GgufType::U8:
    case GgufType::I8:
    case GgufType::BOOL: {
      uint8_t b = c.read<uint8_t>(w);
      if (type == GgufType::BOOL && b > 1) bad(fmt::format("bool value {} is not 0 or 1", b));
      v.bits = b;
      break;
    }
    case GgufType::U16:
    case GgufType::I16:
      v.bits = c.read<uint16_t>(w);
      break;
    case GgufType::U32:
    case GgufType::I32:
    case GgufType::F32:
      v.bits = c.read<uint32_t>(w);
      break;
    case GgufType::U64:
    case GgufType::I64:
    case GgufType::F64:
      v.bits = c.read<uint64_t>(w);
      break;
    case GgufType::STRING:
      v.str = c.read_string(w);
      break;
    case GgufType::ARRAY: {
      if (depth >= kMaxArrayDepth) bad(fmt::format("arrays nested deeper than {}", kMaxArrayDepth));
      const uint32_t et = c.read<uint32_t>(w);
      if (et > static_cast<uint32_t>(GgufType::F64)) bad(fmt::format("unknown array element type {}", et));
      v.elem_type = static_cast<GgufType>(et);
      v.count = c.read<uint64_t>(w);
      const size_t es = gguf_scalar_size(v.elem_type);
      if (es > 0) {
        uint64_t bytes;
        if (mul_overflows(v.count, es, &bytes) || bytes > c.remaining())
          bad(fmt::format("array of {} x {} does not fit in the file ({} bytes remain)", v.count,
                          gguf_type_name(v.elem_type), c.remaining()));
        v.elems = c.take(bytes, w);
        if (v.elem_type == GgufType::BOOL)
          for (uint64_t i = 0; i < v.count; ++i)
            if (v.elems[i] > 1) bad(fmt::format("bool element {} is {}, not 0 or 1", i, v.elems[i]));
      } else if (v.elem_type == GgufType::STRING) {
        // Each string needs at least its 8-byte length.
        if (v.count > c.remaining() / 8)
          bad(fmt::format("array of {} strings does not fit in the file ({} bytes remain)", v.count,
                          c.remaining()));
        v.strings.reserve(v.count);
        for (uint64_t i = 0; i < v.count; ++i) v.strings.push_back(c.read_string(w));
      } else {
        // Each inner array needs at least its element type and count.
        if (v.count > c.remaining() / 12)
          bad(fmt::format("array of {} arrays does not fit in the file ({} bytes remain)", v.count,
                          c.remaining()));
        v.nested.reserve(v.count);
        for (uint64_t i = 0; i < v.count; ++i)
          v.nested.push_back(read_value(c, GgufType::ARRAY, path, key, depth + 1));
      }
      break;
    }
    default:
      bad(fmt::format("unknown value type {}", static_cast<uint32_t>(type)));
  }
  return v;
}

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace

std::string_view gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::U8:
      return "u8";
    case GgufType::I8:
      return "i8";
    case GgufType::U16:
      return "u16";
    case GgufType::I16:
      return "i16";
    case GgufType::U32:
      return "u32";
    case GgufType::I32:
      return "i32";
    case GgufType::F32:
      return "f32";
    case GgufType::BOOL:
      return "bool";
    case GgufType::STRING:
      return "string";
    case GgufType::ARRAY:
      return "array";
    case GgufType::U64:
      return "u64";
    case GgufType::I64:
      return "i64";
    case GgufType::F64:
      return "f64";
  }
  return "?";
}

size_t gguf_scalar_size(GgufType t) {
  switch (t) {
    case GgufType::U8:
    case GgufType::I8:
    case GgufType::BOOL:
      return 1;
    case GgufType::U16:
    case GgufType::I16:
      return 2;
    case GgufType::U32:
    case GgufType::I32:
    case GgufType::F32:
      return 4;
    case GgufType::U64:
    case GgufType::I64:
    case GgufType::F64:
      return 8;
    default:
      return 0;
  }
}

namespace {
bool type_is_integer(GgufType t) {
  switch (t) {
    case GgufType::U8:
    case GgufType::I8:
    case GgufType::U16:
    case GgufType::I16:
    case GgufType::U32:
    case GgufType::I32:
    case GgufType::U64:
    case GgufType::I64:
      return true;
    default:
      return false;
  }
}
bool type_is_float(GgufType t) { return t == GgufType::F32 || t == GgufType::F64; }

// Float -> integer that is defined for every input (a plain cast of NaN or of
// a value beyond +-2^63 is undefined behaviour): truncates toward zero,
// saturates at the int64 range, NaN -> 0. Found by the fuzzer via elem_i64 on
// an f64 array holding -1e270.
int64_t float_to_i64(double d) {
  if (std::isnan(d)) return 0;
  if (d >= 9223372036854775808.0) return std::numeric_limits<int64_t>::max();
  if (d < -9223372036854775808.0) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(d);
}

int64_t scalar_i64(GgufType t, uint64_t bits) {
  switch (t) {
    case GgufType::I8:
      return static_cast<int8_t>(bits);
    case GgufType::I16:
      return static_cast<int16_t>(bits);
    case GgufType::I32:
      return static_cast<int32_t>(bits);
    case GgufType::I64:
      return static_cast<int64_t>(bits);
    case GgufType::F32: {
      float f;
      uint32_t b = static_cast<uint32_t>(bits);
      std::memcpy(&f, &b, 4);
      return float_to_i64(f);
    }
    case GgufType::F64: {
      double d;
      std::memcpy(&d, &bits, 8);
      return float_to_i64(d);
    }
    default:
      return static_cast<int64_t>(bits);
  }
}
double scalar_f64(GgufType t, uint64_t bits) {
  switch (t) {
    case GgufType::F32: {
      float f;
      uint32_t b = static_cast<uint32_t>(bits);
      std::memcpy(&f, &b, 4);
      return f;
    }
    case GgufType::F64: {
      double d;
      std::memcpy(&d, &bits, 8);
      return d;
    }
    case GgufType::U64:
      return static_cast<double>(bits);
    default:
      return static_cast<double>(scalar_i64(t, bits));
  }
}
uint64_t elem_bits(const GgufValue& v, uint64_t i) {
  switch (gguf_scalar_size(v.elem_type)) {
    case 1:
      return v.elems[i];
    case 2:
      return load<uint16_t>(v.elems + 2 * i);
    case 4:
      return load<uint32_t>(v.elems + 4 * i);
    case 8:
      return load<uint64_t>(v.elems + 8 * i);
    default:
      return 0;
  }
}
}  // namespace

bool GgufValue::is_integer() const { return type_is_integer(type) || type == GgufType::BOOL; }
bool GgufValue::is_float() const { return type_is_float(type); }
int64_t GgufValue::as_i64() const { return scalar_i64(type, bits); }
uint64_t GgufValue::as_u64() const { return bits; }
double GgufValue::as_f64() const { return scalar_f64(type, bits); }
double GgufValue::elem_f64(uint64_t i) const { return scalar_f64(elem_type, elem_bits(*this, i)); }
int64_t GgufValue::elem_i64(uint64_t i) const { return scalar_i64(elem_type, elem_bits(*this, i)); }

std::string GgufValue::summary(size_t max_items) const {
  auto scalar = [](GgufType t, uint64_t b) -> std::string {
    if (t == GgufType::BOOL) return b ? "true" : "false";
    if (type_is_float(t)) return fmt::format("{:g}", scalar_f64(t, b));
    if (t == GgufType::U64) return fmt::format("{}", b);
    return fmt::format("{}", scalar_i64(t, b));
  };
  auto quote = [](std::string_view s, size_t max_len) {
    std::string out = "\"";
    for (size_t i = 0; i < s.size() && i < max_len; ++i) {
      char ch = s[i];
      if (ch == '\n')
        out += "\\n";
      else if (ch == '"')
        out += "\\\"";
      else if (static_cast<unsigned char>(ch) < 0x20)
        out += fmt::format("\\x{:02x}", static_cast<unsigned char>(ch));
      else
        out += ch;
    }
    if (s.size() > max_len)
      out += fmt::format("...\" ({} bytes)", s.size());
    else
      out += "\"";
    return out;
  };
  if (type == GgufType::STRING) return quote(str, 60);
  if (type != GgufType::ARRAY) return scalar(type, bits);
  std::string out = fmt::format("[{} x {}: ", gguf_type_name(elem_type), count);
  for (uint64_t i = 0; i < count && i < max_items; ++i) {
    if (i) out += ", ";
    if (elem_type == GgufType::STRING)
      out += quote(strings[i], 24);
    else if (elem_type == GgufType::ARRAY)
      out += nested[i].summary(3);
    else
      out += scalar(elem_type, elem_bits(*this, i));
  }
  if (count > max_items) out += ", ...";
  return out + "]";
}

std::string GgufTensor::shape_str() const {
  std::string s = "{";
  for (size_t i = 0; i < ne.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", ne[i]);
  return s + "}";
}

GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

GgufFile GgufFile::open(const std::string& path) {
  GgufFile f;
  f.path_ = path;
  f.map_ = std::make_unique<MappedFile>(path);
  f.base_ = f.map_->data();
  f.size_ = f.map_->size();
  f.parse();
  return f;
}

GgufFile GgufFile::from_memory(const uint8_t* data, size_t size, const std::string& name) {
  GgufFile f;
  f.path_ = name;
  f.base_ = data;
  f.size_ = size;
  f.parse();
  return f;
}

void GgufFile::parse() {
  const std::string& path = path_;
  Cursor c(base_, size_, path);
  uint32_t magic = c.read<uint32_t>(header_field("magic"));
  if (magic != kMagic)
    fail("{}: not a GGUF file (magic 0x{:08x}, expected 0x{:08x} \"GGUF\")", path, magic, kMagic);
  version_ = c.read<uint32_t>(header_field("version"));
  if (version_ != 2 && version_ != 3)
    fail("{}: unsupported GGUF version {} (supported: 2, 3)", path, version_);
  const uint64_t n_tensors = c.read<uint64_t>(header_field("tensor count"));
  const uint64_t n_kv = c.read<uint64_t>(header_field("metadata count"));

  // A pair needs at least 8 (key length) + 1 (key) + 4 (type) + 1 bytes, a
  // tensor info 8 + 1 + 4 + 8 + 4 + 8. Counts are never trusted for
  // allocation: reservations are capped by what the file can hold, and the
  // parse below fails at the first read past the end. When a count is larger
  // than the whole file could hold, that failure also names the count, since
  // the corrupt count rather than the point where the bytes ran out is the
  // news.
  const uint64_t kv_cap = c.remaining() / 14, tensor_cap = c.remaining() / 33;
  auto with_counts = [&](const Error& e) -> std::string {
    std::string msg = e.what();
    if (n_kv > kv_cap)
      msg += fmt::format(" (the header announces {} metadata pairs, more than a {}-byte file can hold)", n_kv,
                         size_);
    else if (n_tensors > tensor_cap)
      msg += fmt::format(" (the header announces {} tensors, more than a {}-byte file can hold)", n_tensors,
                         size_);
    return msg;
  };

  try {
    kv_.reserve(std::min(n_kv, kv_cap));
    for (uint64_t i = 0; i < n_kv; ++i) {
      const std::string_view key = c.read_string({"metadata key", {}, i, "name"});
      if (key.empty()) fail("{}: metadata key #{} is empty", path, i);
      if (!valid_utf8(key)) fail("{}: metadata key #{} ('{}') is not valid UTF-8", path, i, printable(key));
      if (kv_index_.count(std::string(key))) fail("{}: duplicate metadata key '{}'", path, printable(key));
      const uint32_t t = c.read<uint32_t>({"key", key, 0, "type"});
      if (t > static_cast<uint32_t>(GgufType::F64))
        fail("{}: key '{}': unknown value type {}", path, printable(key), t);
      GgufValue v = read_value(c, static_cast<GgufType>(t), path, key, 0);
      kv_index_.emplace(std::string(key), kv_.size());
      kv_.emplace_back(std::string(key), std::move(v));
    }

    if (const GgufValue* a = find("general.alignment")) {
      if (!a->is_integer() || a->type == GgufType::BOOL)
        fail("{}: key 'general.alignment' has type {}, expected an integer", path, gguf_type_name(a->type));
      const int64_t al = a->as_i64();  // a u64 above 2^63 reads negative and is refused
      if (al <= 0 || al > (1 << 30) || (al & (al - 1)) != 0)
        fail("{}: key 'general.alignment' = {} is not a power of two in [1, 2^30]", path, a->summary());
      alignment_ = static_cast<uint64_t>(al);
    }

    tensors_.reserve(std::min(n_tensors, tensor_cap));
    for (uint64_t i = 0; i < n_tensors; ++i) {
      GgufTensor t;
      const std::string_view name = c.read_string({"tensor", {}, i, "name"});
      if (name.empty()) fail("{}: tensor #{} has an empty name", path, i);
      if (!valid_utf8(name)) fail("{}: tensor #{} name ('{}') is not valid UTF-8", path, i, printable(name));
      t.name = std::string(name);
      const std::string pn = printable(t.name);
      if (tensor_index_.count(t.name)) fail("{}: duplicate tensor name '{}'", path, pn);
      const uint32_t nd = c.read<uint32_t>({"tensor", t.name, 0, "dimension count"});
      if (nd == 0 || nd > kMaxDims)
        fail("{}: tensor '{}': {} dimensions (allowed 1..{})", path, pn, nd, kMaxDims);
      t.ne.resize(nd);
      uint64_t nel = 1;
      for (uint32_t d = 0; d < nd; ++d) {
        t.ne[d] = c.read<uint64_t>({"tensor", t.name, 0, "shape"});
        if (t.ne[d] > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
            mul_overflows(nel, t.ne[d], &nel) ||
            nel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
          fail("{}: tensor '{}': element count overflows (shape {})", path, pn, t.shape_str());
      }
      t.nelements = nel;
      t.ggml_type = c.read<uint32_t>({"tensor", t.name, 0, "type"});
      t.offset = c.read<uint64_t>({"tensor", t.name, 0, "offset"});
      const TypeInfo* ti = type_info(t.ggml_type);
      if (!ti) fail("{}: tensor '{}': unknown ggml type {}", path, pn, t.ggml_type);
      t.dtype = dtype_from_ggml(t.ggml_type);
      // Q2_0's table entry is the g128 geometry, but the g64 layout only needs
      // ne[0] % 64; which one applies is decided below from the bytes.
      const uint32_t block = t.ggml_type == ggml_type::Q2_0 ? 64 : ti->block_size;
      if (t.ne[0] % block != 0)
        fail("{}: tensor '{}': ne[0] = {} is not a multiple of {}'s block size {}", path, pn, t.ne[0],
             ti->name, block);
      if (t.offset % alignment_ != 0)
        fail("{}: tensor '{}': offset {} is not aligned to {}", path, pn, t.offset, alignment_);
      if (t.ggml_type != ggml_type::Q2_0) {
        uint64_t bytes;
        if (mul_overflows(nel / ti->block_size, ti->type_size, &bytes))
          fail("{}: tensor '{}': byte size overflows (shape {})", path, pn, t.shape_str());
        t.nbytes = bytes;
      }
      tensor_index_.emplace(t.name, tensors_.size());
      tensors_.push_back(std::move(t));
    }
  } catch (const Error& e) {
    throw Error(with_counts(e));
  }

  const uint64_t header_end = c.pos();
  const uint64_t pad = (alignment_ - header_end % alignment_) % alignment_;
  data_offset_ = header_end + pad;
  if (n_tensors == 0) return;
  if (data_offset_ > size_)
    fail("{}: truncated: the data section would start at offset {}, past the end of the {}-byte file", path,
         data_offset_, size_);
  const uint64_t data_size = size_ - data_offset_;

  // The space a tensor occupies runs up to the next tensor's offset (or the
  // end of the file). Ties (two tensors at one offset) put empty tensors
  // first: an empty tensor may share its offset with the next one; anything
  // else sharing an offset gets 0 bytes of space and fails the check below.
  std::vector<size_t> order(tensors_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const GgufTensor& x = tensors_[a];
    const GgufTensor& y = tensors_[b];
    if (x.offset != y.offset) return x.offset < y.offset;
    if ((x.nelements == 0) != (y.nelements == 0)) return x.nelements == 0;
    return a < b;
  });
  for (size_t k = 0; k < order.size(); ++k) {
    GgufTensor& t = tensors_[order[k]];
    const std::string pn = printable(t.name);
    if (t.offset > data_size)
      fail("{}: tensor '{}': offset {} is past the end of the data section ({} bytes)", path, pn, t.offset,
           data_size);
    const GgufTensor* next = k + 1 < order.size() ? &tensors_[order[k + 1]] : nullptr;
    const bool next_inside = next && next->offset <= data_size;
    const uint64_t limit = next_inside ? next->offset : data_size;
    const uint64_t avail = limit - t.offset;
    const std::string neighbour =
        next_inside ? fmt::format("tensor '{}' at offset {}", printable(next->name), next->offset)
                    : std::string("the end of the file");
    const char* verb = next_inside ? "overlap" : "run past";
    if (t.ggml_type == ggml_type::Q2_0) {
      // One type id, two layouts: the bytes the tensor occupies decide. A
      // reading fits when it uses the space up to the neighbour, give or take
      // the alignment padding. Both or neither fitting is an error; guessing
      // would run a model on misread weights.
      const uint64_t g128 = (t.ne[0] % 128 == 0) ? t.nelements / 128 * 34 : 0;
      const uint64_t g64 = t.nelements / 64 * 18;
      auto fits = [&](uint64_t s) { return s > 0 && s <= avail && avail - s < alignment_; };
      const bool a = fits(g128), b = fits(g64);
      if (a == b)
        fail(
            "{}: tensor '{}': Q2_0 layout is {}: {} bytes up to {}; the group-128 reading needs {}, the "
            "group-64 reading needs {} (alignment {})",
            path, pn, a ? "ambiguous" : "inconsistent", avail, neighbour, g128, g64, alignment_);
      t.dtype = a ? DType::Q2_0_G128 : DType::Q2_0_G64;
      t.nbytes = a ? g128 : g64;
    }
    if (t.nbytes > avail)
      fail("{}: tensor '{}': {} bytes at offset {} {} {} (only {} bytes available)", path, pn, t.nbytes,
           t.offset, verb, neighbour, avail);
    t.data = base_ + data_offset_ + t.offset;
  }
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = kv_index_.find(std::string(key));
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const GgufValue& GgufFile::get(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) fail("{}: missing metadata key '{}'", path_, printable(key));
  return *v;
}

int64_t GgufFile::get_i64(std::string_view key) const {
  const GgufValue& v = get(key);
  if (!type_is_integer(v.type))
    fail("{}: key '{}' has type {}, expected an integer", path_, printable(key), gguf_type_name(v.type));
  if (v.type == GgufType::U64 && v.bits > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    fail("{}: key '{}' = {} is out of range", path_, printable(key), v.bits);
  return v.as_i64();
}

uint64_t GgufFile::get_u64(std::string_view key) const {
  const GgufValue& v = get(key);
  if (!type_is_integer(v.type))
    fail("{}: key '{}' has type {}, expected an integer", path_, printable(key), gguf_type_name(v.type));
  if (v.type == GgufType::U64) return v.bits;
  int64_t i = v.as_i64();
  if (i < 0) fail("{}: key '{}' = {} must not be negative", path_, printable(key), i);
  return static_cast<uint64_t>(i);
}

uint32_t GgufFile::get_u32(std::string_view key) const {
  uint64_t v = get_u64(key);
  if (v > std::numeric_limits<uint32_t>::max())
    fail("{}: key '{}' = {} does not fit in 32 bits", path_, printable(key), v);
  return static_cast<uint32_t>(v);
}

double GgufFile::get_f64(std::string_view key) const {
  const GgufValue& v = get(key);
  if (!type_is_integer(v.type) && !type_is_float(v.type))
    fail("{}: key '{}' has type {}, expected a number", path_, printable(key), gguf_type_name(v.type));
  return v.as_f64();
}

bool GgufFile::get_bool(std::string_view key) const {
  const GgufValue& v = get(key);
  if (v.type != GgufType::BOOL)
    fail("{}: key '{}' has type {}, expected bool", path_, printable(key), gguf_type_name(v.type));
  return v.bits != 0;
}

std::string_view GgufFile::get_string(std::string_view key) const {
  const GgufValue& v = get(key);
  if (v.type != GgufType::STRING)
    fail("{}: key '{}' has type {}, expected string", path_, printable(key), gguf_type_name(v.type));
  return v.str;
}

const GgufValue& GgufFile::get_array(std::string_view key) const {
  const GgufValue& v = get(key);
  if (v.type != GgufType::ARRAY)
    fail("{}: key '{}' has type {}, expected an array", path_, printable(key), gguf_type_name(v.type));
  return v;
}

const GgufValue& GgufFile::get_array(std::string_view key, GgufType elem) const {
  const GgufValue& v = get_array(key);
  if (v.elem_type != elem)
    fail("{}: key '{}' is an array of {}, expected an array of {}", path_, printable(key),
         gguf_type_name(v.elem_type), gguf_type_name(elem));
  return v;
}

uint64_t GgufFile::get_u64_or(std::string_view key, uint64_t fallback) const {
  return has(key) ? get_u64(key) : fallback;
}
double GgufFile::get_f64_or(std::string_view key, double fallback) const {
  return has(key) ? get_f64(key) : fallback;
}
bool GgufFile::get_bool_or(std::string_view key, bool fallback) const {
  return has(key) ? get_bool(key) : fallback;
}
std::string_view GgufFile::get_string_or(std::string_view key, std::string_view fallback) const {
  return has(key) ? get_string(key) : fallback;
}

const GgufTensor* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensor& GgufFile::tensor(std::string_view name) const {
  const GgufTensor* t = find_tensor(name);
  if (!t) fail("{}: missing tensor '{}'", path_, printable(name));
  return *t;
}

}  // namespace bonsai
