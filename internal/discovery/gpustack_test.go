package discovery

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// fakeGPUStack serves /v2/model-instances (or only /v1 when v1only), two
// instances a page, behind a bearer key.
type fakeGPUStack struct {
	mu        sync.Mutex
	v1only    bool
	instances []gpustackInstance
	paths     []string
}

func (f *fakeGPUStack) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.paths = append(f.paths, r.URL.Path)
	if r.Header.Get("Authorization") != "Bearer gpustack-key" {
		http.Error(w, `{"detail":"unauthorized"}`, http.StatusUnauthorized)
		return
	}
	if r.URL.Path != "/v1/model-instances" && (f.v1only || r.URL.Path != "/v2/model-instances") {
		http.NotFound(w, r)
		return
	}
	page, _ := strconv.Atoi(r.URL.Query().Get("page"))
	const per = 2
	total := (len(f.instances) + per - 1) / per
	lo, hi := min((page-1)*per, len(f.instances)), min(page*per, len(f.instances))
	json.NewEncoder(w).Encode(map[string]any{
		"items":      f.instances[lo:hi],
		"pagination": map[string]int{"page": page, "perPage": per, "total": len(f.instances), "totalPage": total},
	})
}

func TestGPUStackPoll(t *testing.T) {
	instances := []gpustackInstance{
		{ID: 1, Name: "qwen-a1b2", ModelName: "qwen3-32b", WorkerIP: "10.0.0.11", Port: 40001, State: "running"},
		{ID: 2, Name: "qwen-c3d4", ModelName: "qwen3-32b", WorkerIP: "10.0.0.12", Port: 40001, State: "starting"},
		{ID: 3, Name: "llama-e5f6", ModelName: "llama-8b", WorkerIP: "172.17.0.2", Advertise: "10.0.0.12", Ports: []int{40002}, State: "running"},
		{ID: 4, Name: "bad name!", ModelName: "qwen3-32b", WorkerIP: "10.0.0.13", Port: 40003, State: "running"},
		{ID: 5, Name: "pending", ModelName: "qwen3-32b", State: "scheduled"},
	}
	all := []Target{
		{Name: "10.0.0.13:40003", URL: "http://10.0.0.13:40003", Models: []string{"qwen3-32b"}},
		{Name: "llama-e5f6", URL: "http://10.0.0.12:40002", Models: []string{"llama-8b"}},
		{Name: "qwen-a1b2", URL: "http://10.0.0.11:40001", Models: []string{"qwen3-32b"}},
	}
	cases := []struct {
		name   string
		v1only bool
		models []string
		want   []Target
		paths  []string
	}{
		{name: "v2, every page, running only", want: all,
			paths: []string{"/v2/model-instances", "/v2/model-instances", "/v2/model-instances"}},
		{name: "v1 fallback", v1only: true, want: all,
			paths: []string{"/v2/model-instances", "/v1/model-instances", "/v1/model-instances", "/v1/model-instances"}},
		{name: "model filter", models: []string{"llama-8b"}, want: all[1:2],
			paths: []string{"/v2/model-instances", "/v2/model-instances", "/v2/model-instances"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fake := &fakeGPUStack{v1only: c.v1only, instances: instances}
			srv := httptest.NewServer(fake)
			defer srv.Close()
			src := NewGPUStack(GPUStackConfig{URL: srv.URL + "/", APIKey: "gpustack-key", Scheme: "http", Models: c.models}, srv.Client(), nil)
			got, err := src.Poll(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(c.want, got); d != "" {
				t.Errorf("targets (-want +got):\n%s", d)
			}
			if d := cmp.Diff(c.paths, fake.paths); d != "" {
				t.Errorf("requests (-want +got):\n%s", d)
			}
			// A second poll remembers the API version.
			fake.paths = nil
			if _, err := src.Poll(context.Background()); err != nil {
				t.Fatal(err)
			}
			if want := c.paths[len(c.paths)-1]; fake.paths[0] != want {
				t.Errorf("second poll asked %s first, want %s", fake.paths[0], want)
			}
		})
	}
}

func TestGPUStackBadKeyNamesTheKey(t *testing.T) {
	srv := httptest.NewServer(&fakeGPUStack{})
	defer srv.Close()
	_, err := NewGPUStack(GPUStackConfig{URL: srv.URL, APIKey: "wrong", Scheme: "http"}, srv.Client(), nil).Poll(context.Background())
	if err == nil || !strings.Contains(err.Error(), "discovery.gpustack.api_key") {
		t.Fatalf("err = %v, want one naming discovery.gpustack.api_key", err)
	}
}
