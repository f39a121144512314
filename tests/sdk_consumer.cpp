// An SDK consumer in C++: sdk_consumer_c's job through the header-only wrapper trtmc.hpp.
//
//   sdk_consumer_cpp BUNDLE IMAGE.rgb.f32 HEIGHT WIDTH [--expect-sha256 HEX]
//
// Prints one JSON object with logits, label_names, vocabulary_id, engine and the bundle's digest,
// read after the model is released; with --expect-sha256, only the bundle whose digest is HEX is
// opened. Exit status: 0, the trtmc_code of a failed call (its name and message go to stderr), or
// 64 for a usage error and 66 for an unreadable image file.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "trtmc.hpp"

namespace {

std::optional<std::int64_t> parse_size(const std::string& text) {
  std::size_t used = 0;
  try {
    std::int64_t value = std::stoll(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

std::optional<std::vector<float>> read_floats(const std::string& path) {
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  if (!file) return std::nullopt;
  std::streamsize bytes = file.tellg();
  if (bytes < 0 || bytes % static_cast<std::streamsize>(sizeof(float)) != 0) return std::nullopt;
  std::vector<float> data(static_cast<std::size_t>(bytes) / sizeof(float));
  file.seekg(0);
  if (!file.read(reinterpret_cast<char*>(data.data()), bytes)) return std::nullopt;
  return data;
}

std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out += escaped;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

void print(const trtmc::Scores& scores, const std::string& digest) {
  std::cout << "{\"engine\": " << quoted(scores.engine()) << ", \"digest\": " << quoted(digest)
            << ", \"vocabulary_id\": " << quoted(scores.vocabulary_id()) << ", \"label_names\": [";
  std::vector<std::string> names = scores.label_names();
  for (std::size_t i = 0; i < names.size(); ++i) std::cout << (i ? ", " : "") << quoted(names[i]);
  std::cout << "], \"logits\": [";
  char number[32];
  for (std::size_t i = 0; i < scores.size(); ++i) {
    std::snprintf(number, sizeof number, "%.9g", scores.data()[i]);
    std::cout << (i ? ", " : "") << number;
  }
  std::cout << "]}\n";
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<std::int64_t> height, width;
  bool pinned = argc == 7 && std::string(argv[5]) == "--expect-sha256";
  if (argc == 5 || pinned) height = parse_size(argv[3]), width = parse_size(argv[4]);
  if (!height || !width) {
    std::cerr << "usage: " << argv[0] << " BUNDLE IMAGE.rgb.f32 HEIGHT WIDTH [--expect-sha256 HEX]\n";
    return 64;
  }
  std::optional<std::vector<float>> pixels = read_floats(argv[2]);
  if (!pixels) {
    std::cerr << "sdk_consumer_cpp: cannot read " << argv[2] << " as float32 values\n";
    return 66;
  }
  try {
    std::optional<trtmc::Scores> scores;
    std::string digest;
    {
      trtmc::ImageToClassScores model = pinned ? trtmc::ImageToClassScores(argv[1], std::string(argv[6]))
                                               : trtmc::ImageToClassScores(argv[1]);
      digest = model.digest();
      for (const std::string& line : model.skipped_engines()) {
        std::cerr << "sdk_consumer_cpp: " << line << "; using " << model.engine() << " instead\n";
      }
      scores.emplace(model(pixels->data(), pixels->size(), *height, *width));
    }  // the model is released here; the scores own what they return
    print(*scores, digest);
  } catch (const trtmc::Error& error) {
    std::cerr << "sdk_consumer_cpp: " << error.code_name() << ": " << error.what() << "\n";
    return static_cast<int>(error.code());
  }
  return 0;
}
