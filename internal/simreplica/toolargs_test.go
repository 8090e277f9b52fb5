package simreplica

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestToolArguments(t *testing.T) {
	tests := []struct {
		name, schema, want string
	}{
		{"no schema", ``, `{}`},
		{"empty schema", `{}`, `{}`},
		{"not JSON", `{"type":`, `{}`},
		{"not an object", `{"type":"string"}`, `{}`},
		{"nothing required", `{"type":"object","properties":{"city":{"type":"string"}}}`, `{}`},
		{"one of each type", `{"type":"object","required":["s","i","n","b","a","o","z"],"properties":{
			"s":{"type":"string"},"i":{"type":"integer"},"n":{"type":"number"},"b":{"type":"boolean"},
			"a":{"type":"array","items":{"type":"string"}},"o":{"type":"object"},"z":{"type":"null"}}}`,
			`{"a":[],"b":false,"i":0,"n":0,"o":{},"s":"sim","z":null}`},
		{"const, enum, default and minimum win", `{"type":"object","required":["c","e","d","m"],"properties":{
			"c":{"const":"v1"},"e":{"type":"string","enum":["celsius","fahrenheit"]},
			"d":{"type":"integer","default":7},"m":{"type":"integer","minimum":1}}}`,
			`{"c":"v1","d":7,"e":"celsius","m":1}`},
		{"a nullable type list takes its other type", `{"type":"object","required":["x"],"properties":{"x":{"type":["null","integer"]}}}`, `{"x":0}`},
		{"nested objects are filled alike", `{"type":"object","required":["loc"],"properties":{"loc":{"type":"object","required":["lat"],"properties":{"lat":{"type":"number"}}}}}`,
			`{"loc":{"lat":0}}`},
		{"properties without a type are an object", `{"required":["q"],"properties":{"q":{"type":"string"}}}`, `{"q":"sim"}`},
		{"a required name with no schema", `{"type":"object","required":["q"]}`, `{"q":"sim"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := toolArguments(json.RawMessage(tt.schema)); got != tt.want {
				t.Errorf("toolArguments(%s) = %s, want %s", tt.schema, got, tt.want)
			}
		})
	}
}

// TestToolArgumentsBounded: a schema nested deeper than maxSchemaDepth
// still gives an answer, its innermost objects left empty.
func TestToolArgumentsBounded(t *testing.T) {
	schema := `{"type":"string"}`
	for range 50 {
		schema = `{"type":"object","required":["x"],"properties":{"x":` + schema + `}}`
	}
	got := toolArguments(json.RawMessage(schema))
	if want := strings.Repeat(`{"x":`, maxSchemaDepth) + `{}` + strings.Repeat(`}`, maxSchemaDepth); got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

// TestForcedToolCallsFillRequiredParameters: each API's forced call carries
// arguments its tool's schema accepts, streamed or not.
func TestForcedToolCallsFillRequiredParameters(t *testing.T) {
	r := startReplica(t, Options{})
	const params = `{"type":"object","required":["city","days"],"properties":{"city":{"type":"string"},"days":{"type":"integer","minimum":1},"unit":{"type":"string"}}}`
	const want = `{"city":"sim","days":1}`
	tests := []struct {
		name, path, body string
		args             func(t *testing.T, body []byte) string
	}{
		{"chat", "/v1/chat/completions",
			`{"model":"sim-model","max_tokens":8,"tool_choice":"required","messages":[{"role":"user","content":"weather?"}],"tools":[{"type":"function","function":{"name":"get_weather","parameters":` + params + `}}]}`,
			func(t *testing.T, body []byte) string {
				var v struct {
					Choices []struct {
						Message struct {
							ToolCalls []struct{ Function struct{ Arguments string } } `json:"tool_calls"`
						}
					}
				}
				decode(t, body, &v)
				return v.Choices[0].Message.ToolCalls[0].Function.Arguments
			}},
		{"chat streamed", "/v1/chat/completions",
			`{"model":"sim-model","max_tokens":8,"stream":true,"tool_choice":{"type":"function","function":{"name":"get_weather"}},"messages":[{"role":"user","content":"weather?"}],"tools":[{"type":"function","function":{"name":"other"}},{"type":"function","function":{"name":"get_weather","parameters":` + params + `}}]}`,
			func(t *testing.T, body []byte) string {
				return firstData(t, body, func(data []byte) string {
					var v struct {
						Choices []struct {
							Delta struct {
								ToolCalls []struct{ Function struct{ Arguments string } } `json:"tool_calls"`
							}
						}
					}
					decode(t, data, &v)
					if len(v.Choices) == 0 || len(v.Choices[0].Delta.ToolCalls) == 0 {
						return ""
					}
					return v.Choices[0].Delta.ToolCalls[0].Function.Arguments
				})
			}},
		{"anthropic messages", "/v1/messages",
			`{"model":"sim-model","max_tokens":8,"tool_choice":{"type":"any"},"messages":[{"role":"user","content":"weather?"}],"tools":[{"name":"get_weather","input_schema":` + params + `}]}`,
			func(t *testing.T, body []byte) string {
				var v struct {
					Content []struct{ Input json.RawMessage }
				}
				decode(t, body, &v)
				return string(v.Content[0].Input)
			}},
		{"anthropic messages streamed", "/v1/messages",
			`{"model":"sim-model","max_tokens":8,"stream":true,"tool_choice":{"type":"tool","name":"get_weather"},"messages":[{"role":"user","content":"weather?"}],"tools":[{"name":"get_weather","input_schema":` + params + `}]}`,
			func(t *testing.T, body []byte) string {
				return firstData(t, body, func(data []byte) string {
					var v struct {
						Delta struct {
							PartialJSON string `json:"partial_json"`
						}
					}
					decode(t, data, &v)
					return v.Delta.PartialJSON
				})
			}},
		{"responses", "/v1/responses",
			`{"model":"sim-model","max_output_tokens":8,"input":"weather?","tool_choice":"required","tools":[{"type":"function","name":"get_weather","parameters":` + params + `}]}`,
			func(t *testing.T, body []byte) string {
				var v struct{ Output []struct{ Arguments string } }
				decode(t, body, &v)
				return v.Output[0].Arguments
			}},
		{"responses streamed", "/v1/responses",
			`{"model":"sim-model","max_output_tokens":8,"stream":true,"input":"weather?","tool_choice":{"type":"function","name":"get_weather"},"tools":[{"type":"function","name":"get_weather","parameters":` + params + `}]}`,
			func(t *testing.T, body []byte) string {
				return firstData(t, body, func(data []byte) string {
					var v struct {
						Type      string
						Arguments string
					}
					decode(t, data, &v)
					if v.Type != "response.function_call_arguments.done" {
						return ""
					}
					return v.Arguments
				})
			}},
	}
	client := testClient(waitTimeout)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := client.Post(r.URL()+tt.path, "application/json", strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			body, err := io.ReadAll(res.Body)
			if err != nil {
				t.Fatal(err)
			}
			if res.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", res.StatusCode, body)
			}
			if got := tt.args(t, body); got != want {
				t.Errorf("arguments %s, want %s; body:\n%s", got, want, body)
			}
		})
	}
}

func decode(t *testing.T, data []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%v: %s", err, data)
	}
}

// firstData returns the first non-empty value pick finds in an SSE body's
// data lines.
func firstData(t *testing.T, body []byte, pick func([]byte) string) string {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		if v := pick([]byte(data)); v != "" {
			return v
		}
	}
	return ""
}
