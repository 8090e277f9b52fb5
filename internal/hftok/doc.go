// Package hftok reproduces, in pure Go, the token ids a Hugging Face
// tokenizer (and so an engine such as vLLM) computes for a prompt, and renders
// a model's chat template the way transformers' apply_chat_template does.
//
// # Scope
//
// Load accepts a tokenizer.json of the byte-level BPE family only: model.type
// "BPE" (no dropout, no byte_fallback, no continuing_subword_prefix or
// end_of_word_suffix), normalizer null or NFC, and a pre_tokenizer that is
// either a Sequence of one Split (a Regex pattern, behavior Isolated, invert
// false) followed by a ByteLevel with use_regex false, or a single ByteLevel
// with use_regex true (the GPT-2 pattern). add_prefix_space must be false.
// This covers GPT-2, Llama 3 and Qwen 2 / 2.5 / 3 style tokenizers. Anything
// else (other models, normalizers, pre-tokenizers, added tokens with lstrip,
// rstrip or single_word set) is an error at load, never a silently different
// tokenization.
//
// Encode returns the ids Hugging Face tokenizers' encode gives with
// add_special_tokens=False: added tokens (special or not) are split out of the
// text first (leftmost-longest, the non-normalized ones on the raw text, then
// the normalized ones on the normalized rest), every other piece is
// normalized, split with the pre-tokenizer's pattern and encoded by BPE merges
// in rank order (a piece that is itself in the vocabulary stays whole when the
// file sets ignore_merges, as Llama 3's does). That is how vLLM tokenizes a
// rendered chat prompt, whose template already holds the special tokens.
// EncodeWithSpecialTokens adds what the post-processor adds with
// add_special_tokens=True (vLLM's completions prompts), such as Llama 3's
// leading <|begin_of_text|>, for a TemplateProcessing post-processor (or
// ByteLevel, which adds nothing); another post-processor is an error there.
//
// The pre-tokenizer pattern is compiled with github.com/dlclark/regexp2/v2,
// which has the lookahead ((?!\S)) those patterns use and Go's regexp lacks.
// Hugging Face compiles it with Oniguruma; the two agree on every string in
// testdata (whitespace, digits, CJK, emoji, combining marks, contractions,
// code), but they are different engines: a character class such as \p{L}
// follows Go's Unicode tables, which may differ from Oniguruma's for
// characters assigned in recent Unicode versions.
//
// ChatTemplate renders the chat_template of tokenizer_config.json with
// github.com/ardanlabs/jinja for OpenAI-style messages with
// add_generation_prompt true, as transformers does (bos_token, eos_token,
// raise_exception; no tools). A template using a Jinja feature or filter that
// library lacks fails with an error that says so.
//
// Verified against references from the Hugging Face implementations (see
// testdata/README.md and scripts/tokref): the Rust tokenizers library for
// token ids, Python Jinja2 with transformers' settings for templates.
package hftok
