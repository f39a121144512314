/* An SDK consumer in C: classify one decoded image with a trtmc bundle and print every score as JSON.
 *
 *   sdk_consumer_c BUNDLE IMAGE.rgb.f32 HEIGHT WIDTH [--expect-sha256 HEX]
 *
 * IMAGE.rgb.f32 holds the image's RGB float32 values in [0, 1], row-major HWC, as written by
 * `trtmc decode PHOTO -o IMAGE.rgb.f32` (which prints HEIGHT and WIDTH). With --expect-sha256,
 * only the bundle whose digest is HEX (`trtmc inspect` prints it) is opened. Prints one JSON object
 * with logits, label_names, vocabulary_id, engine and the bundle's digest, read after the model is
 * released. Exit status: 0, the trtmc_code of a failed call (its name and message go to stderr), or
 * 64 for a usage error and 66 for an unreadable image file. Uses only the public header trtmc.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trtmc.h"

static int fail(trtmc_status* status) {
  int code = (int)trtmc_status_code(status);
  fprintf(stderr, "sdk_consumer_c: %s: %s\n", trtmc_code_name(trtmc_status_code(status)), trtmc_status_message(status));
  trtmc_status_release(status);
  return code;
}

static int parse_size(const char* text, int64_t* value) {
  char* end = NULL;
  *value = (int64_t)strtoll(text, &end, 10);
  return end != text && *end == '\0';
}

/* The whole file as floats; NULL (with a message) when it cannot be read. */
static float* read_floats(const char* path, size_t* count) {
  FILE* file = fopen(path, "rb");
  float* data = NULL;
  long bytes = -1;
  if (file && fseek(file, 0, SEEK_END) == 0) bytes = ftell(file);
  if (bytes >= 0 && bytes % (long)sizeof(float) == 0 && fseek(file, 0, SEEK_SET) == 0) {
    *count = (size_t)bytes / sizeof(float);
    data = malloc(bytes > 0 ? (size_t)bytes : 1);
    if (data && fread(data, sizeof(float), *count, file) != *count) {
      free(data);
      data = NULL;
    }
  }
  if (file) fclose(file);
  if (!data) fprintf(stderr, "sdk_consumer_c: cannot read %s as float32 values\n", path);
  return data;
}

static void print_string(const char* text) {
  putchar('"');
  for (const unsigned char* c = (const unsigned char*)text; *c; ++c) {
    if (*c == '"' || *c == '\\') printf("\\%c", *c);
    else if (*c < 0x20) printf("\\u%04x", *c);
    else putchar(*c);
  }
  putchar('"');
}

static void print_scores(const trtmc_scores* scores, const char* digest) {
  printf("{\"engine\": ");
  print_string(trtmc_scores_engine(scores));
  printf(", \"digest\": ");
  print_string(digest);
  printf(", \"vocabulary_id\": ");
  print_string(trtmc_scores_vocabulary_id(scores));
  printf(", \"label_names\": [");
  for (size_t i = 0; i < trtmc_scores_label_count(scores); ++i) {
    if (i) printf(", ");
    print_string(trtmc_scores_label_name(scores, i));
  }
  printf("], \"logits\": [");
  const float* logits = trtmc_scores_logits(scores);
  for (size_t i = 0; i < trtmc_scores_count(scores); ++i) printf(i ? ", %.9g" : "%.9g", logits[i]);
  printf("]}\n");
}

int main(int argc, char** argv) {
  int64_t height = 0, width = 0;
  int pinned = argc == 7 && strcmp(argv[5], "--expect-sha256") == 0;
  if ((argc != 5 && !pinned) || !parse_size(argv[3], &height) || !parse_size(argv[4], &width)) {
    fprintf(stderr, "usage: %s BUNDLE IMAGE.rgb.f32 HEIGHT WIDTH [--expect-sha256 HEX]\n", argv[0]);
    return 64;
  }
  if (!TRTMC_ABI_COMPATIBLE(trtmc_abi_version())) {
    fprintf(stderr, "sdk_consumer_c: libtrtmc ABI %u does not serve this program (built for %d)\n",
            (unsigned)trtmc_abi_version(), TRTMC_ABI_VERSION);
    return 64;
  }
  size_t count = 0;
  float* pixels = read_floats(argv[2], &count);
  if (!pixels) return 66;

  trtmc_option expect_sha256 = {"expect_sha256", pinned ? argv[6] : NULL};
  trtmc_model* model = NULL;
  trtmc_status* status = trtmc_model_open(argv[1], pinned ? &expect_sha256 : NULL, pinned ? 1 : 0, &model);
  if (status) {
    free(pixels);
    return fail(status);
  }
  char digest[65]; /* the model's string dies with it: 64 hex digits and the terminator */
  snprintf(digest, sizeof digest, "%s", trtmc_model_digest(model));
  for (size_t i = 0; i < trtmc_model_skipped_count(model); ++i) {
    fprintf(stderr, "sdk_consumer_c: %s; using %s instead\n", trtmc_model_skipped(model, i), trtmc_model_engine(model));
  }
  trtmc_scores* scores = NULL;
  status = trtmc_classify(model, pixels, count, height, width, &scores);
  trtmc_model_release(model); /* the scores own what they return */
  free(pixels);
  if (status) return fail(status);
  print_scores(scores, digest);
  trtmc_scores_release(scores);
  return 0;
}
