package openai

import (
	"encoding/json"
	"reflect"
	"testing"
)

// FuzzDecodeTop checks decodeTop against the json.Unmarshal it replaced in
// the observer of responses, for a completion and for a stream chunk: on
// every valid body both succeed or fail alike and read the same model,
// choices and usage; on any body decodeTop does not panic.
func FuzzDecodeTop(f *testing.F) {
	for _, s := range []string{
		`{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":20,"completion_tokens":9,"total_tokens":29}}`,
		`{"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":3}}}`,
		`{"model":"m","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}],"usage":null}`,
		`{"choices":[{"message":{"content":"\"usage\":{\"prompt_tokens\":7}"},"usage":{"prompt_tokens":8}}],"usage":{"completion_tokens":1}}`,
		`{"USAGE":{"Prompt_Tokens":4},"Model":"a","model":"b"}`,
		`{"u\u017fage":{"prompt_tokens":3},"m\u006fdel":"x"}`,
		`{"uſage":{"prompt_tokens":3}}`,
		`{"usage":{"prompt_tokens":1},"usage":{"completion_tokens":2}}`,
		`{"usage":{"prompt_tokens":1},"usage":null,"usage":{"completion_tokens":2}}`,
		`{"usage":{"prompt_tokens":1.5}}`,
		`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":12,"output_tokens":3}}`,
		`{"usage":{"input_tokens":"12"}}`,
		`{"usage":{"input_tokens":4,"cache_read_input_tokens":8,"cache_creation_input_tokens":0,"output_tokens":1}}`,
		`{"usage":{"prompt_tokens":"1"}}`,
		`{"model":5,"usage":{"prompt_tokens":1}}`,
		`{"choices":[{"text":5}],"usage":{"prompt_tokens":1}}`,
		`{"choices":{"a":1}}`,
		`{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
		`{"choices":[{"index":0,"delta":{"content":"a\nb \u00e9 \"q\""},"finish_reason":null}]}`,
		`{"choices":[{"delta":{"reasoning_content":"x","Reasoning":null,"tool_calls":[ {"id":"t"} ]}},{"text":"y"}]}`,
		`{"choices":[{"delta":{"tool_calls":null}},null,{"delta":null}]}`,
		`{"choices":[{"delta":{"content":"a"},"DELTA":{"reasoning":"b"},"text":null}]}`,
		`{"choices":[{"text":"a"}],"choices":[{"delta":{"content":"b"}}]}`,
		`{"choices":[{"delta":{"content":5}}]}`, `{"choices":[{"delta":[]}]}`, `{"choices":[1]}`, `{"choices":[]}`,
		`{"choices":[{"delta":{"conten\u0074":"z","tool_calls":{}}}]}`,
		`null`, ` null `, `[]`, `"x"`, `{}`, ` { } `, `{"a":1,}`, `{"a":"\"}"} x`, `{"a" 1}`, `{"a":}`,
		`{"usage":{"prompt_tokens":1}`, `{"usage":{"prompt_tokens":1}} {}`, `{"a":[1,}`, `{"\ud800":1,"usage":{}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var fastC, slowC completion
		fastOK := decodeCompletion(body, &fastC)
		slowOK := json.Unmarshal(body, &slowC) == nil
		var fastK, slowK chunk
		fastKOK := decodeChunk(body, &fastK)
		slowKOK := json.Unmarshal(body, &slowK) == nil
		if !json.Valid(body) {
			return // only: no panic
		}
		if fastOK != slowOK || (slowOK && !reflect.DeepEqual(fastC, slowC)) {
			t.Fatalf("completion: decodeTop %v %+v, json.Unmarshal %v %+v", fastOK, fastC, slowOK, slowC)
		}
		if fastKOK != slowKOK || (slowKOK && !reflect.DeepEqual(fastK, slowK)) {
			t.Fatalf("chunk: decodeTop %v %+v, json.Unmarshal %v %+v", fastKOK, fastK, slowKOK, slowK)
		}
	})
}

// BenchmarkDecodeUsage is the read of a non-streamed answer's usage:
// decodeTop against json.Unmarshal of the whole answer.
func BenchmarkDecodeUsage(b *testing.B) {
	body := []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"m",` +
		`"choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help you today?"},` +
		`"finish_reason":"stop"}],"usage":{"prompt_tokens":20,"completion_tokens":9,"total_tokens":29}}`)
	b.Run("decodeTop", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var c completion
			if !decodeCompletion(body, &c) || c.Usage == nil {
				b.Fatal("no usage")
			}
		}
	})
	b.Run("json.Unmarshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var c completion
			if json.Unmarshal(body, &c) != nil || c.Usage == nil {
				b.Fatal("no usage")
			}
		}
	})
}

// BenchmarkFirstChunk is the read of a stream's first chunk (that of
// scripts/proxybench): every chunk before the first token is decoded. The
// observer does it after the chunk is flushed to the client.
func BenchmarkFirstChunk(b *testing.B) {
	line := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"m",` +
		`"choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":null}]}`)
	b.ReportAllocs()
	for b.Loop() {
		var r UsageReader
		r.Line(line)
		if !r.Token {
			b.Fatal("no token")
		}
	}
}

// TestAnthropicUsage: the Messages API's usage counts its cache reads and
// writes in the prompt (Anthropic's input_tokens leaves them out), and
// one without them (vLLM's) is all input.
func TestAnthropicUsage(t *testing.T) {
	for body, want := range map[string]TokenCounts{
		`{"type":"message_delta","usage":{"input_tokens":4,"cache_read_input_tokens":8,"cache_creation_input_tokens":2,"output_tokens":3}}`: {PromptTokens: 14, CachedTokens: 8, CompletionTokens: 3},
		`{"type":"message_delta","usage":{"input_tokens":12,"output_tokens":3}}`:                                                            {PromptTokens: 12, CompletionTokens: 3},
		`{"usage":{"prompt_tokens":5,"completion_tokens":2,"input_tokens":99}}`:                                                             {PromptTokens: 5, CompletionTokens: 2},
	} {
		var c chunk
		if !decodeChunk([]byte(body), &c) || c.Usage == nil {
			t.Fatalf("%s: not decoded", body)
		}
		if got := c.Usage.counts(); got != want {
			t.Errorf("%s: %+v, want %+v", body, got, want)
		}
	}
}
