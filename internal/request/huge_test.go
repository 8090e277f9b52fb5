package request

import (
	"bytes"
	"net/http"
	"reflect"
	"runtime"
	"testing"
)

// hugeTokenIDs is a /v1/completions body whose prompt is n token ids
// (15M ids are 30 MB).
func hugeTokenIDs(n int) []byte {
	var b bytes.Buffer
	b.Grow(2*n + 64)
	b.WriteString(`{"model":"m","prompt":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('1' + byte(i%9))
	}
	b.WriteString(`],"max_tokens":16}`)
	return b.Bytes()
}

// BenchmarkParseHugeTokenIDs: the cost of profiling one 15M-token-id
// completions request, the work three such clients used to take from all
// others. Compare ns/op and B/op with BenchmarkParse.
func BenchmarkParseHugeTokenIDs(b *testing.B) {
	body := hugeTokenIDs(15_000_000)
	for _, blocks := range []bool{false, true} {
		b.Run(map[bool]string{false: "blocks=false", true: "blocks=true"}[blocks], func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.PromptBlocks = blocks
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Parse(cfg, "/v1/completions", http.Header{}, body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestHugeTokenIDsBoundedAllocations: profiling a 30 MB completions body
// of 15M token ids allocates a small fraction of the body (the token count
// is exact, the text hashed for prefix and blocks is capped), instead of
// ~1 GB.
func TestHugeTokenIDsBoundedAllocations(t *testing.T) {
	const ids = 15_000_000
	body := hugeTokenIDs(ids)
	cfg := DefaultConfig()
	cfg.PromptBlocks = true // the most expensive profile (prefix-tree)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	p, err := Parse(cfg, "/v1/completions", http.Header{}, body)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if p.PromptTokens != ids || p.PrefixKey == "" || len(p.PromptBlocks) == 0 {
		t.Fatalf("profile: %d tokens, prefix %q, %d blocks", p.PromptTokens, p.PrefixKey, len(p.PromptBlocks))
	}
	if got, limit := after.TotalAlloc-before.TotalAlloc, uint64(len(body))/4; got > limit {
		t.Fatalf("profiling a %d MiB body allocated %d MiB, want < %d MiB", len(body)>>20, got>>20, limit>>20)
	}
}

// FuzzDecodeObject checks the zero-copy top-level reader against the
// streaming decoder it replaced: both accept and reject the same bodies and
// read the same fields.
func FuzzDecodeObject(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`))
	f.Add([]byte(`{"model":"m","prompt":[1,2,3],"max_tokens":4}`))
	f.Add([]byte(`{"a":1,}`))
	f.Add([]byte(`{"a":"\"}"} x`))
	f.Add([]byte(`{"messages":5,"m\u006fdel":"x"}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"system","content":[{"type":"text","text":"a"}]},{"ROLE":"user","content":null,"tool_calls":[{"id":"1"}]}]}`))
	f.Add([]byte(`{"messages":[{"role":"a","role":null,"content":"x","Content":5}, {"r\u006fle":"b"}, 1]}`))
	f.Add([]byte(`{"messages":[{"role":"\u00e9t\u00e9","content":"\ud800","tool_calls":null}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		fast, errFast := decodeObject(body)
		slow, errSlow := decodeObjectErr(body)
		if (errFast == nil) != (errSlow == nil) {
			t.Fatalf("zero-copy reader error %v, streaming decoder error %v", errFast, errSlow)
		}
		if errFast != nil {
			if errFast.Error() != errSlow.Error() {
				t.Fatalf("errors differ: %q vs %q", errFast, errSlow)
			}
			return
		}
		if len(fast.fields) != len(slow.fields) || fast.hasMessages != slow.hasMessages || (fast.messagesErr == nil) != (slow.messagesErr == nil) {
			t.Fatalf("fields %d vs %d, messages %v vs %v", len(fast.fields), len(slow.fields), fast.hasMessages, slow.hasMessages)
		}
		if !sameMessages(fast.messages, slow.messages) {
			t.Fatalf("messages %#v vs %#v", fast.messages, slow.messages)
		}
		for k, v := range slow.fields {
			if !bytes.Equal(bytes.TrimSpace(fast.fields[k]), bytes.TrimSpace(v)) {
				t.Fatalf("field %q: %q vs %q", k, fast.fields[k], v)
			}
		}
	})
}

// sameMessages compares decoded messages; tool_calls by their bytes (the
// fast path keeps a sub-slice of the body, json.Unmarshal a copy).
func sameMessages(a, b []message) bool {
	if len(a) != len(b) || (a == nil) != (b == nil) {
		return false
	}
	for i := range a {
		if a[i].Role != b[i].Role || !reflect.DeepEqual(a[i].content(), b[i].content()) ||
			!bytes.Equal(a[i].ToolCalls, b[i].ToolCalls) {
			return false
		}
	}
	return true
}
