// Package qwentok lays out the Qwen2.5 tokenizer of internal/hftok's test
// data as a model directory (tokenizer.json, tokenizer_config.json), for
// tests that configure a model's tokenizer.
package qwentok

import (
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// Dir returns a temporary model directory holding the Qwen2.5 tokenizer
// and its chat template (Apache-2.0, see internal/hftok/testdata).
func Dir(tb testing.TB) string {
	tb.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		tb.Fatal("qwentok: no caller")
	}
	src := filepath.Join(filepath.Dir(file), "..", "..", "hftok", "testdata", "qwen2_5")
	dir := tb.TempDir()
	f, err := os.Open(filepath.Join(src, "tokenizer.json.gz"))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		tb.Fatal(err)
	}
	out, err := os.Create(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := io.Copy(out, zr); err != nil {
		tb.Fatal(err)
	}
	if err := out.Close(); err != nil {
		tb.Fatal(err)
	}
	cfg, err := os.ReadFile(filepath.Join(src, "tokenizer_config.json"))
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), cfg, 0o644); err != nil {
		tb.Fatal(err)
	}
	return dir
}
