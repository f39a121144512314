/* trtmc.h: the C ABI of libtrtmc, the native SDK for trtmc bundles.
 *
 * One task, image_to_class_scores: a contiguous host RGB float32 HWC image in [0, 1] of any size
 * in, every class logit (float32, checkpoint order, no softmax) out, with the checkpoint's label
 * names and vocabulary id when it gave them. The bundle fixes the preprocessing (resize, center
 * crop, normalization) and the precision; the task takes no runtime options. Opening a bundle loads
 * native code from it (a bundle is a program): pin the bundle you trust with the expect_sha256
 * option (below).
 *
 *   trtmc_model* model = NULL;
 *   trtmc_status* status = trtmc_model_open("lite0.bundle", NULL, 0, &model);
 *   if (status) { fprintf(stderr, "%s\n", trtmc_status_message(status)); trtmc_status_release(status); }
 *   trtmc_scores* scores = NULL;
 *   status = trtmc_classify(model, pixels, height * width * 3, height, width, &scores);
 *   trtmc_model_release(model);              // the scores stay readable
 *   const float* logits = trtmc_scores_logits(scores);
 *   trtmc_scores_release(scores);
 *
 * Conventions (those of ONNX Runtime's C API):
 * - Handles are opaque; each has one release function, which accepts NULL.
 * - Every call that can fail returns a trtmc_status*: NULL on success, else a status object that
 *   the caller owns and releases with trtmc_status_release. Nothing throws across this boundary.
 *   On failure the output argument is left NULL.
 * - Strings and arrays returned by accessors belong to the handle they came from and stay valid
 *   until that handle is released. A trtmc_scores owns everything it returns: it stays readable
 *   after the model that produced it is released.
 * - Accessors given a NULL handle return 0 or NULL.
 * - A model may be shared between threads; calls to trtmc_classify on one model run one at a time.
 *
 * ABI versioning rule: TRTMC_ABI_VERSION is MAJOR * 1000 + MINOR. Within one MAJOR, releases only
 * add functions and append new trtmc_code values; no existing function's signature, meaning or
 * struct layout changes, and nothing is removed. Anything else raises MAJOR, which is also the
 * shared library's SONAME version (libtrtmc.so.MAJOR). A program built against this header runs
 * with any library whose trtmc_abi_version() has the same MAJOR and a MINOR at least as large; check
 * with TRTMC_ABI_COMPATIBLE(trtmc_abi_version()) at start-up.
 */
#ifndef TRTMC_H
#define TRTMC_H

#include <stddef.h>
#include <stdint.h>

/* libtrtmc is built with hidden visibility; only the functions below are exported. */
#if defined(TRTMC_BUILDING) && defined(__GNUC__)
#define TRTMC_API __attribute__((visibility("default")))
#else
#define TRTMC_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define TRTMC_ABI_VERSION_MAJOR 1
#define TRTMC_ABI_VERSION_MINOR 1 /* 1: the expect_sha256 option, trtmc_model_digest, codes 12 and 13 */
#define TRTMC_ABI_VERSION (TRTMC_ABI_VERSION_MAJOR * 1000 + TRTMC_ABI_VERSION_MINOR)
/* Same MAJOR, MINOR at least this header's. */
#define TRTMC_ABI_COMPATIBLE(library_version) \
  ((library_version) >= TRTMC_ABI_VERSION && (library_version) < (TRTMC_ABI_VERSION_MAJOR + 1) * 1000)

/* What went wrong. Values are stable: new ones are only appended. */
typedef enum trtmc_code {
  TRTMC_OK = 0,
  TRTMC_ERROR_NULL_ARGUMENT = 1,      /* a required pointer argument is NULL */
  TRTMC_ERROR_INVALID_SIZE = 2,       /* height or width is zero or negative, or too large */
  TRTMC_ERROR_SIZE_MISMATCH = 3,      /* the buffer's element count is not height * width * 3 */
  TRTMC_ERROR_NON_FINITE = 4,         /* a pixel value is NaN or infinite */
  TRTMC_ERROR_OUT_OF_RANGE = 5,       /* a pixel value lies outside [0, 1] */
  TRTMC_ERROR_UNSUPPORTED_OPTION = 6, /* an option other than expect_sha256 was given */
  TRTMC_ERROR_BUNDLE = 7,             /* missing, truncated, tampered, unknown-version or foreign bundle */
  TRTMC_ERROR_NO_ENGINE = 8,          /* no engine in the bundle can run here (the message says why) */
  TRTMC_ERROR_INFERENCE = 9,          /* the engine failed while running */
  TRTMC_ERROR_OUT_OF_MEMORY = 10,
  TRTMC_ERROR_INTERNAL = 11,          /* a bug in libtrtmc: please report the message */
  /* Since ABI 1.1: */
  TRTMC_ERROR_DIGEST_MISMATCH = 12,   /* the bundle's digest is not the expect_sha256 given: not the pinned bundle */
  TRTMC_ERROR_INVALID_ARGUMENT = 13   /* an argument's value is malformed (e.g. expect_sha256 is not 64 hex digits) */
} trtmc_code;

typedef struct trtmc_status trtmc_status;
typedef struct trtmc_model trtmc_model;
typedef struct trtmc_scores trtmc_scores;

/* A name = value setting for trtmc_model_open. There is one (since ABI 1.1):
 *
 *   "expect_sha256" = the bundle's digest, 64 hex digits in either case, surrounding whitespace
 *   ignored (what `trtmc inspect` prints as "digest": the sha256 of the bundle's manifest.json,
 *   which records every other member's sha256). A bundle whose digest differs is refused with
 *   TRTMC_ERROR_DIGEST_MISMATCH before anything else in it is read and before any engine (native
 *   code) loads, as `trtmc classify --expect-sha256` refuses it. A value that is not 64 hex digits,
 *   or the option given twice, is TRTMC_ERROR_INVALID_ARGUMENT; a NULL value is
 *   TRTMC_ERROR_NULL_ARGUMENT.
 *
 * image_to_class_scores itself has no runtime options (preprocessing and precision are fixed
 * when the bundle is built): every other name is refused with TRTMC_ERROR_UNSUPPORTED_OPTION.
 * New options are ABI additions. */
typedef struct trtmc_option {
  const char* name;
  const char* value;
} trtmc_option;

/* The library's TRTMC_ABI_VERSION (see the versioning rule above). */
TRTMC_API uint32_t trtmc_abi_version(void);

/* "TRTMC_ERROR_SIZE_MISMATCH" for TRTMC_ERROR_SIZE_MISMATCH; "TRTMC_ERROR_UNKNOWN" for other values. */
TRTMC_API const char* trtmc_code_name(trtmc_code code);

/* ---- status ---- */
TRTMC_API trtmc_code trtmc_status_code(const trtmc_status* status);       /* TRTMC_OK for NULL */
TRTMC_API const char* trtmc_status_message(const trtmc_status* status);   /* "" for NULL */
TRTMC_API void trtmc_status_release(trtmc_status* status);

/* ---- model ---- */

/* Open and verify a bundle (format version, every member's size and sha256, no member outside
 * the manifest), then load the first engine that can run here, as trtmc's Python runtime does:
 * TensorRT plans first, then Inductor, then the rest; one that cannot run here or fails to load is
 * passed over (trtmc_model_skipped says why). `options` may be NULL when `option_count` is 0; the
 * options are checked before the bundle is opened. */
TRTMC_API trtmc_status* trtmc_model_open(const char* bundle_path, const trtmc_option* options,
                                         size_t option_count, trtmc_model** model);
TRTMC_API void trtmc_model_release(trtmc_model* model);

/* The key of the engine in use, e.g. "inductor-cpu-fp32". */
TRTMC_API const char* trtmc_model_engine(const trtmc_model* model);

/* The open bundle's digest: 64 lower-case hex digits, the sha256 of its manifest.json as stored
 * (what `trtmc inspect` prints and expect_sha256 pins). Since ABI 1.1. */
TRTMC_API const char* trtmc_model_digest(const trtmc_model* model);

/* The engines passed over, one line each saying why ("engine tensorrt-cuda-fp16 cannot run
 * here: ..."); index < trtmc_model_skipped_count. NULL for an index out of range. */
TRTMC_API size_t trtmc_model_skipped_count(const trtmc_model* model);
TRTMC_API const char* trtmc_model_skipped(const trtmc_model* model, size_t index);

/* ---- image_to_class_scores ---- */

/* Classify one image: `pixels` holds `element_count` floats, RGB interleaved, row-major
 * (height, width, 3), each in [0, 1]. Every check (sizes, NaN/Inf, range) runs before any
 * preprocessing or inference. */
TRTMC_API trtmc_status* trtmc_classify(trtmc_model* model, const float* pixels, size_t element_count,
                                       int64_t height, int64_t width, trtmc_scores** scores);
TRTMC_API void trtmc_scores_release(trtmc_scores* scores);

/* Every class logit, checkpoint order: trtmc_scores_count values. */
TRTMC_API size_t trtmc_scores_count(const trtmc_scores* scores);
TRTMC_API const float* trtmc_scores_logits(const trtmc_scores* scores);

/* The checkpoint's label names: either one per class or none (then indices are model-local).
 * NULL for an index out of range. */
TRTMC_API size_t trtmc_scores_label_count(const trtmc_scores* scores);
TRTMC_API const char* trtmc_scores_label_name(const trtmc_scores* scores, size_t index);

/* The vocabulary the label names come from, e.g. "imagenet-1k"; "" when unknown. */
TRTMC_API const char* trtmc_scores_vocabulary_id(const trtmc_scores* scores);

/* The key of the engine that computed these scores. */
TRTMC_API const char* trtmc_scores_engine(const trtmc_scores* scores);

#ifdef __cplusplus
}
#endif

#endif /* TRTMC_H */
