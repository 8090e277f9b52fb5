package request

import (
	"net/http"
	"strings"
	"testing"
)

func TestParseSessionKey(t *testing.T) {
	long := strings.Repeat("k", 300)
	tests := []struct {
		name   string
		cfg    func(*Config)
		header http.Header
		body   string
		want   string
	}{
		{"none", nil, nil, `{"model":"m"}`, ""},
		{"x-session-id", nil, hdr("X-Session-Id", "s1"), `{"model":"m"}`, "s1"},
		{"header names are case-insensitive", nil, hdr("x-claude-code-session-id", "cc"), `{"model":"m"}`, "cc"},
		{"header list order wins", nil, hdr("Thread-Id", "t", "X-Kilocode-Taskid", "kilo"), `{"model":"m"}`, "kilo"},
		{"every default header: cursor", nil, hdr("X-Cursor-Conversation-Id", "cur"), `{"model":"m"}`, "cur"},
		{"every default header: helicone", nil, hdr("Helicone-Session-Id", "he"), `{"model":"m"}`, "he"},
		{"every default header: session-id", nil, hdr("Session-Id", "sid"), `{"model":"m"}`, "sid"},
		{"header beats body", nil, hdr("X-Session-Id", "h"), `{"model":"m","session_id":"b"}`, "h"},
		{"blank header skipped", nil, hdr("X-Session-Id", "  "), `{"model":"m","session_id":"b"}`, "b"},
		{"prompt_cache_key", nil, nil, `{"model":"m","prompt_cache_key":"pck","session_id":"s"}`, "pck"},
		{"conversation_id before thread_id", nil, nil, `{"model":"m","thread_id":"th","conversation_id":"conv"}`, "conv"},
		{"thread_id", nil, nil, `{"model":"m","thread_id":"th"}`, "th"},
		{"numeric session_id", nil, nil, `{"model":"m","session_id":12345}`, "12345"},
		{"object session_id ignored", nil, nil, `{"model":"m","session_id":{"a":1},"metadata":{"session_id":"ms"}}`, "ms"},
		{"metadata.session_id", nil, nil, `{"model":"m","metadata":{"session_id":"ms"}}`, "ms"},
		{"claude code user_id", nil, nil, `{"model":"m","metadata":{"user_id":"user_ab12_account_77_session_0b1c-2d"}}`, "session_0b1c-2d"},
		{"claude code JSON user_id", nil, nil, `{"model":"m","metadata":{"user_id":"{\"device_id\":\"d\",\"session_id\":\"9f\"}"}}`, "session_9f"},
		{"plain user_id is not a session", nil, nil, `{"model":"m","metadata":{"user_id":"alice"}}`, ""},
		{"metadata not an object", nil, nil, `{"model":"m","metadata":"x"}`, ""},
		{"control chars stripped (header injection)", nil, hdr("X-Session-Id", "abc\r\nX-Evil: 1"), `{"model":"m"}`, "abcX-Evil: 1"},
		{"control chars stripped in body", nil, nil, `{"model":"m","session_id":"a\u0000b\u001bc\u202ed"}`, "abcd"},
		{"invalid UTF-8 dropped", nil, hdr("X-Session-Id", "ab\xffcd"), `{"model":"m"}`, "abcd"},
		{"unicode kept", nil, hdr("X-Session-Id", "сессия-1"), `{"model":"m"}`, "сессия-1"},
		{"only control chars: next source", nil, hdr("X-Session-Id", "\x01\x02"), `{"model":"m","session_id":"b"}`, "b"},
		{"long key hashed", nil, hdr("X-Session-Id", long), `{"model":"m"}`, "sha256:" + sha256hex(long)},
		{"custom header list", func(c *Config) { c.SessionHeaders = []string{"X-User-Session"} }, hdr("X-User-Session", "u", "X-Session-Id", "s"), `{"model":"m"}`, "u"},
		{"custom body path", func(c *Config) { c.SessionBodyFields = []string{"extra.deep.sid"} }, nil, `{"model":"m","extra":{"deep":{"sid":"d"}},"session_id":"s"}`, "d"},
		{"empty lists: no key", func(c *Config) { c.SessionHeaders, c.SessionBodyFields = nil, nil }, hdr("X-Session-Id", "s"), `{"model":"m","session_id":"s"}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			p, err := Parse(cfg, chatPath, tt.header, []byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if p.SessionKey != tt.want {
				t.Errorf("SessionKey = %q, want %q", p.SessionKey, tt.want)
			}
		})
	}
}

func sha256hex(s string) string {
	return strings.TrimPrefix(sanitizeKey(s), "sha256:")
}

func TestSanitizeKeyHash(t *testing.T) {
	k := sanitizeKey(strings.Repeat("k", 300))
	if len(k) != len("sha256:")+32 || !strings.HasPrefix(k, "sha256:") {
		t.Errorf("long key = %q", k)
	}
	if sanitizeKey(strings.Repeat("k", 300)) == sanitizeKey(strings.Repeat("k", 301)) {
		t.Error("different long keys hash equal")
	}
	if k := sanitizeKey(strings.Repeat("k", MaxKeyBytes)); len(k) != MaxKeyBytes {
		t.Errorf("key of exactly MaxKeyBytes changed to %q", k)
	}
}

func TestParsePrefixKey(t *testing.T) {
	sys4096 := strings.Repeat("s", 4096)
	runes := strings.Repeat("é", 5000) // 2 bytes each
	tests := []struct {
		name   string
		path   string
		header http.Header
		body   string
		want   string
	}{
		{"no system prompt", chatPath, nil, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, ""},
		{"system string", chatPath, nil, `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}`, md5hex("be brief")},
		{"developer role", chatPath, nil, `{"model":"m","messages":[{"role":"developer","content":"dev"}]}`, md5hex("dev")},
		{"system and developer joined", chatPath, nil, `{"model":"m","messages":[{"role":"system","content":"a"},{"role":"user","content":"u"},{"role":"developer","content":"b"}]}`, md5hex("a\nb")},
		{"content parts", chatPath, nil, `{"model":"m","messages":[{"role":"system","content":[{"type":"text","text":"p1"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"p2"}]}]}`, md5hex("p1\np2")},
		{"empty system content", chatPath, nil, `{"model":"m","messages":[{"role":"system","content":""}]}`, ""},
		{"null system content", chatPath, nil, `{"model":"m","messages":[{"role":"system","content":null}]}`, ""},
		{"first 4096 chars only", chatPath, nil, `{"model":"m","messages":[{"role":"system","content":"` + sys4096 + `tail"}]}`, md5hex(sys4096)},
		{"characters, not bytes", chatPath, nil, `{"model":"m","messages":[{"role":"system","content":"` + runes + `"}]}`, md5hex(strings.Repeat("é", 4096))},
		{"tenant joined", chatPath, hdr("X-Project-Id", "acme"), `{"model":"m","messages":[{"role":"system","content":"be brief"}]}`, "acme:" + md5hex("be brief")},
		{"second tenant header", chatPath, hdr("X-Kilocode-Projectid", "kp"), `{"model":"m","messages":[{"role":"system","content":"be brief"}]}`, "kp:" + md5hex("be brief")},
		{"tenant alone makes no key", chatPath, hdr("X-Project-Id", "acme"), `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, ""},
		{"tenant sanitized", chatPath, hdr("X-Project-Id", "ac\nme"), `{"model":"m","messages":[{"role":"system","content":"x"}]}`, "acme:" + md5hex("x")},
		{"completions prompt", compPath, nil, `{"model":"m","prompt":"once upon"}`, md5hex("once upon")},
		{"completions prompt array", compPath, nil, `{"model":"m","prompt":["a","b"]}`, md5hex("a\nb")},
		{"completions token ids", compPath, nil, `{"model":"m","prompt":[1, 2, 3]}`, md5hex("[1,2,3]")},
		{"completions token batches", compPath, nil, `{"model":"m","prompt":[[1],[2,3]]}`, md5hex("[[1],[2,3]]")},
		{"completions no prompt", compPath, nil, `{"model":"m"}`, ""},
		{"embeddings have no prefix key", embPath, nil, `{"model":"m","input":"text"}`, ""},
		{"messages API top-level system", "/v1/messages", nil, `{"model":"m","system":[{"type":"text","text":"sys"}],"messages":[]}`, md5hex("sys")},
		{"responses API instructions", "/v1/responses", nil, `{"model":"m","instructions":"ins"}`, md5hex("ins")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Parse(DefaultConfig(), tt.path, tt.header, []byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if p.PrefixKey != tt.want {
				t.Errorf("PrefixKey = %q, want %q", p.PrefixKey, tt.want)
			}
		})
	}
}

func TestTenantAndAPIKey(t *testing.T) {
	h := http.Header{}
	h.Set("X-Project-Id", " team-a ")
	h.Set("Authorization", "Bearer  sk-vip ")
	if got := Tenant(DefaultConfig(), h); got != "team-a" {
		t.Errorf("Tenant = %q, want team-a", got)
	}
	if got := APIKey(h); got != "sk-vip" {
		t.Errorf("APIKey = %q, want sk-vip", got)
	}
	h = http.Header{}
	h.Set("X-Api-Key", "sk-ant")
	if got := APIKey(h); got != "sk-ant" {
		t.Errorf("APIKey from x-api-key = %q", got)
	}
	h.Set("Authorization", "Basic abc")
	if got := APIKey(h); got != "sk-ant" {
		t.Errorf("APIKey with a Basic Authorization = %q, want x-api-key's", got)
	}
	if Tenant(DefaultConfig(), http.Header{}) != "" || APIKey(http.Header{}) != "" {
		t.Error("no headers: want no tenant and no key")
	}
}
