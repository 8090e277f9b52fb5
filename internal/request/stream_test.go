package request

import "testing"

// `"stream": 1` or `"yes"` is streamed by vLLM (pydantic's lax bool: true,
// the integer 1, the float 1.0, and the strings 1, on, t, true, y, yes in
// any case) but llmlb treated it as unary: no stream idle timer, tokens not
// counted. One row per form.
func TestStreamReadAsVLLMReadsIt(t *testing.T) {
	tests := []struct {
		value string
		want  bool
	}{
		{`true`, true},
		{`1`, true},
		{`1.0`, true},
		{`1e0`, true},
		{`"1"`, true},
		{`"true"`, true},
		{`"True"`, true},
		{`"TRUE"`, true},
		{`"yes"`, true},
		{`"Yes"`, true},
		{`"y"`, true},
		{`"on"`, true},
		{`"t"`, true},
		{`false`, false},
		{`0`, false},
		{`0.0`, false},
		{`"0"`, false},
		{`"false"`, false},
		{`"no"`, false},
		{`"off"`, false},
		{`null`, false},
		{`2`, false},       // vLLM refuses it (400): not a stream
		{`"maybe"`, false}, // likewise
		{`" yes"`, false},  // pydantic does not trim
		{`[]`, false},
		{`{}`, false},
	}
	for _, tc := range tests {
		body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":` + tc.value + `}`
		p, err := Parse(Config{}, chatPath, nil, []byte(body))
		if err != nil {
			t.Errorf("stream %s: %v", tc.value, err)
			continue
		}
		if p.Stream != tc.want {
			t.Errorf("stream %s: Stream = %v, want %v", tc.value, p.Stream, tc.want)
		}
	}
}
