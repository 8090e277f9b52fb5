package simreplica

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/llmlb/llmlb/internal/modeltok"
	"github.com/llmlb/llmlb/internal/request"
	"github.com/llmlb/llmlb/internal/testutil/qwentok"
)

// TestResponsesTokenizedAsVLLMServesThem: with the model's tokenizer, a
// /v1/responses request's prompt is the chat vLLM turns it into (tools,
// tool calls and their outputs rendered), as llmlb renders it; one the
// rendering refuses falls back to the roles and texts of its items.
func TestResponsesTokenizedAsVLLMServesThem(t *testing.T) {
	tok, err := modeltok.Load(qwentok.Dir(t))
	if err != nil {
		t.Fatal(err)
	}
	r := startReplica(t, Options{Model: "m", Tokenizer: tok})
	const (
		instructions = `"You are a coding agent."`
		tools        = `[{"type":"function","name":"shell","description":"Runs a command.","parameters":{"type":"object","properties":{"cmd":{"type":"string"}},"required":["cmd"]}}]`
		input        = `[{"role":"user","content":[{"type":"input_text","text":"List the files."}]},` +
			`{"type":"function_call","call_id":"call_1","name":"shell","arguments":"{\"cmd\":\"ls\"}"},` +
			`{"type":"function_call_output","call_id":"call_1","output":"main.go"}]`
	)
	inputTokens := func(body string) int {
		t.Helper()
		res, err := testClient(waitTimeout).Post(r.URL()+"/v1/responses", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", res.StatusCode, b)
		}
		var v struct {
			Usage struct {
				InputTokens int `json:"input_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatal(err)
		}
		return v.Usage.InputTokens
	}
	ids, err := tok.ChatRequestTokens(request.ChatRequest{Responses: true, Instructions: json.RawMessage(instructions),
		Input: json.RawMessage(input), Tools: json.RawMessage(tools)})
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"m","max_output_tokens":1,"instructions":` + instructions + `,"tools":` + tools + `,"input":` + input + `}`
	if got := inputTokens(body); got != len(ids) {
		t.Fatalf("input_tokens %d, want %d: the rendering of vLLM's /v1/responses", got, len(ids))
	}

	// A reasoning item is not rendered: the roles and texts are.
	refused := `[{"role":"user","content":"Hi"},{"type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"hm"}]}]`
	tm, err := responsesMessages(&responsesRequest{Input: json.RawMessage(refused)})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := tok.ChatTokens(tm)
	if err != nil {
		t.Fatal(err)
	}
	if got := inputTokens(`{"model":"m","max_output_tokens":1,"input":` + refused + `}`); got != len(plain) {
		t.Fatalf("input_tokens %d, want %d: the roles and texts", got, len(plain))
	}
}
