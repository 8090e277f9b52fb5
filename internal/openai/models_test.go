package openai

import (
	"net/http"
	"testing"
)

func TestModelsAnswer(t *testing.T) {
	models := []string{"a", "b"}
	cases := []struct {
		name, path string
		models     []string
		status     int
		body       string
	}{
		{"list", "/v1/models", models, http.StatusOK,
			`{"object":"list","data":[{"id":"a","object":"model","created":0,"owned_by":"llmlb"},{"id":"b","object":"model","created":0,"owned_by":"llmlb"}]}` + "\n"},
		{"empty list", "/v1/models", nil, http.StatusOK, `{"object":"list","data":[]}` + "\n"},
		{"one", "/v1/models/b", models, http.StatusOK, `{"id":"b","object":"model","created":0,"owned_by":"llmlb"}` + "\n"},
		{"unknown", "/v1/models/c", models, http.StatusNotFound,
			`{"error":{"message":"the model \"c\" does not exist on any replica","type":"invalid_request_error","code":"model_not_found"}}` + "\n"},
		{"no id", "/v1/models/", models, http.StatusNotFound,
			`{"error":{"message":"the model \"\" does not exist on any replica","type":"invalid_request_error","code":"model_not_found"}}` + "\n"},
		{"id with a slash", "/v1/models/org/m", []string{"org/m"}, http.StatusOK,
			`{"id":"org/m","object":"model","created":0,"owned_by":"llmlb"}` + "\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, body := ModelsAnswer(c.path, c.models, "llmlb")
			if status != c.status || string(body) != c.body {
				t.Errorf("got %d %s, want %d %s", status, body, c.status, c.body)
			}
		})
	}
}

// TestModelEmbedded: a server's own model type that embeds Model encodes
// OpenAI's fields first, then its own, at the same level.
func TestModelEmbedded(t *testing.T) {
	type card struct {
		Model
		Root string `json:"root"`
	}
	got := string(jsonLine(List[card]{Object: ObjectList, Data: []card{{Model: Model{ID: "m", Object: ObjectModel, Created: 7, OwnedBy: "vllm"}, Root: "m"}}}))
	want := `{"object":"list","data":[{"id":"m","object":"model","created":7,"owned_by":"vllm","root":"m"}]}` + "\n"
	if got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}
