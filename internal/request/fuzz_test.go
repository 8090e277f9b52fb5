package request

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"unicode"
)

var fuzzPaths = []string{chatPath, compPath, embPath, "/v1/messages", "/v1/models", "/v1/responses"}

// FuzzParse checks that no body, path or header makes Parse panic, that
// every error is a bad request, and that keys stay safe to log.
func FuzzParse(f *testing.F) {
	f.Add(uint8(0), "s1", "acme", []byte(`{"model":"m","messages":[{"role":"system","content":"hi"}]}`))
	f.Add(uint8(1), "", "", []byte(`{"model":"m","prompt":[1,2,3],"max_tokens":4}`))
	f.Add(uint8(2), "", "", []byte(`{"model":"e","input":["a","b"]}`))
	f.Add(uint8(3), "x\r\ny", "", []byte(`{"model":"m","system":"s","messages":[]}`))
	f.Add(uint8(3), "", "", []byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"text","text":"r"}]},{"type":"tool_use","name":"f","input":{"a":1}}]}]}`))
	f.Add(uint8(0x80), "", "", []byte(`{"model":"m","messages":[{"role":"system","content":"hi"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}`))
	f.Add(uint8(0x81), "", "", []byte(`{"model":"m","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`))
	f.Add(uint8(5), "", "", []byte(`{"model":"m","instructions":"i","input":[{"role":"user","content":[{"type":"input_text","text":"x"}]},{"type":"function_call","name":"f","arguments":"{}"},{"type":"function_call_output","output":[{"type":"input_text","text":"o"}]},7,null]}`))
	f.Fuzz(func(t *testing.T, pathSel uint8, session, tenant string, body []byte) {
		cfg := DefaultConfig()
		cfg.PromptBlocks = true
		if pathSel&0x80 != 0 {
			// The model's own tokenizer (a stand-in for modeltok's):
			// whatever the body, no panic, and blocks hashed by tokens
			// only from what it tokenized.
			cfg.Tokenizer = func(string) PromptTokenizer { return &byteTokenizer{} }
		}
		h := http.Header{}
		h.Set("X-Session-Id", session)
		h.Set("X-Project-Id", tenant)
		path := fuzzPaths[int(pathSel)%len(fuzzPaths)]
		p, err := Parse(cfg, path, h, body)
		if err != nil {
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("error %v does not wrap ErrBadRequest", err)
			}
			if !strings.HasPrefix(err.Error(), "request: ") {
				t.Fatalf("error %q lacks the package prefix", err)
			}
			return
		}
		if len(p.SessionKey) > MaxKeyBytes || len(p.PrefixKey) > MaxKeyBytes+1+32 {
			t.Fatalf("keys too long: session %d bytes, prefix %d bytes", len(p.SessionKey), len(p.PrefixKey))
		}
		for _, k := range []string{p.SessionKey, p.PrefixKey} {
			if strings.IndexFunc(k, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
				t.Fatalf("key %q has unprintable characters", k)
			}
		}
		if p.PromptTokens < 0 || p.OutputTokens < 0 {
			t.Fatalf("negative tokens: %+v", p)
		}
		if p.TokenBlocks && (cfg.Tokenizer == nil || len(p.PromptBlocks) > p.PromptTokens/16) {
			t.Fatalf("token blocks without a tokenizer, or more blocks than tokens: %+v", p)
		}
	})
}
