package openai

import (
	"encoding/json"
	"net/http"
)

// Object names of the list and model objects.
const (
	ObjectList  = "list"
	ObjectModel = "model"
)

// List is OpenAI's list envelope: {"object":"list","data":[...]}.
type List[T any] struct {
	Object string `json:"object"`
	Data   []T    `json:"data"`
}

// Model is one entry of the /v1/models list. A server that says more
// (vLLM's root, max_model_len) embeds it in a type of its own.
type Model struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// ModelList is the /v1/models response.
type ModelList = List[Model]

// ModelsAnswer is the answer to GET on a models path (IsModelsPath): the
// list of models for PathModels, the one model for PathModels+"/{id}"
// (404 model_not_found when it is not among them), each owned by ownedBy.
// The body is JSON ending in a newline.
func ModelsAnswer(path string, models []string, ownedBy string) (status int, body []byte) {
	if path == PathModels {
		list := ModelList{Object: ObjectList, Data: make([]Model, 0, len(models))}
		for _, m := range models {
			list.Data = append(list.Data, Model{ID: m, Object: ObjectModel, OwnedBy: ownedBy})
		}
		return http.StatusOK, jsonLine(list)
	}
	id := path[len(PathModels)+1:]
	for _, m := range models {
		if m == id {
			return http.StatusOK, jsonLine(Model{ID: m, Object: ObjectModel, OwnedBy: ownedBy})
		}
	}
	a := ModelNotFound(id)
	return a.Status, ErrorJSON(a.Type, a.Code, a.Message)
}

// jsonLine is v as JSON and a newline; v is one of the package's types,
// which always encode.
func jsonLine(v any) []byte {
	b, _ := json.Marshal(v)
	return append(b, '\n')
}
