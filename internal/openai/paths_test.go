package openai

import (
	"net/http"
	"testing"
)

func TestCheckPath(t *testing.T) {
	cases := []struct {
		path, wantCode string
		ok             bool
		status         int
	}{
		{"/v1/chat/completions", "", true, 0},
		{"/v1/models", "", true, 0},
		{"/v1/", "", true, 0},
		{"/v1/../metrics", CodeInvalidPath, false, http.StatusBadRequest},
		{"/v1/./x", CodeInvalidPath, false, http.StatusBadRequest},
		{"/metrics/..", CodeInvalidPath, false, http.StatusBadRequest}, // dot segments win over the prefix
		{"/v1/a..b/c", "", true, 0},
		{"/metrics", CodeNotFound, false, http.StatusNotFound},
		{"/v1", CodeNotFound, false, http.StatusNotFound},
		{"", CodeNotFound, false, http.StatusNotFound},
	}
	for _, c := range cases {
		a, ok := CheckPath(c.path)
		if ok != c.ok || a.Status != c.status || a.Code != c.wantCode {
			t.Errorf("CheckPath(%q) = %+v %v, want %d %q %v", c.path, a, ok, c.status, c.wantCode, c.ok)
		}
		if !ok && a.Type != TypeInvalidRequest {
			t.Errorf("CheckPath(%q) type %q", c.path, a.Type)
		}
	}
	if a, _ := CheckPath("/x"); a.Message != "unknown path /x" {
		t.Errorf("message %q", a.Message)
	}
}

func TestPathClasses(t *testing.T) {
	cases := []struct {
		path                            string
		models, completions, firstToken bool
	}{
		{"/v1/models", true, false, false},
		{"/v1/models/", true, false, false},
		{"/v1/models/m1", true, false, false},
		{"/v1/modelsx", false, false, false},
		{"/v1/chat/completions", false, true, true},
		{"/v1/completions", false, true, true},
		{"/v1/messages", false, false, true},
		{"/v1/responses", false, false, false},
		{"/v1/embeddings", false, false, false},
	}
	for _, c := range cases {
		if got := IsModelsPath(c.path); got != c.models {
			t.Errorf("IsModelsPath(%q) = %v", c.path, got)
		}
		if got := CompletionsPath(c.path); got != c.completions {
			t.Errorf("CompletionsPath(%q) = %v", c.path, got)
		}
		if got := FirstChunkIsToken(c.path); got != c.firstToken {
			t.Errorf("FirstChunkIsToken(%q) = %v", c.path, got)
		}
	}
}
