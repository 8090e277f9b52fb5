package discovery

import (
	"context"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestSourcesDriveTheFleet runs each fake source through a Syncer into a
// fake fleet: the first set is added; when a replica leaves the source it
// drains while a request is in flight on it, and is removed once that
// request finishes; the others are untouched.
func TestSourcesDriveTheFleet(t *testing.T) {
	type fixture struct {
		src    Source
		first  []string // fleet after the first set
		leaves string   // the replica that leaves
		remove func()   // makes the source drop it
	}
	cases := map[string]func(t *testing.T) fixture{
		"kubernetes": func(t *testing.T) fixture {
			cs := fake.NewClientset(slice("vllm-abc", "vllm", "http", 8000, ep{"vllm-0", "10.1.0.10", nil}, ep{"vllm-1", "10.1.0.11", nil}))
			return fixture{
				src:    NewKubernetesWith(KubernetesConfig{Service: "vllm", Port: "http"}, "inference", KubeClients{Slices: cs.DiscoveryV1(), Pods: cs.CoreV1(), Clientset: cs}, nil),
				first:  []string{"vllm-0", "vllm-1"},
				leaves: "vllm-0",
				remove: func() {
					s := slice("vllm-abc", "vllm", "http", 8000, ep{"vllm-0", "10.1.0.10", ptr(false)}, ep{"vllm-1", "10.1.0.11", nil})
					if _, err := cs.DiscoveryV1().EndpointSlices("inference").Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
						t.Error(err)
					}
				},
			}
		},
		"dns": func(t *testing.T) fixture {
			res := &fakeResolver{ips: []string{"10.0.0.1", "10.0.0.2"}}
			return fixture{
				src:    NewDNS(DNSConfig{Name: "vllm", Record: "a", Port: 8000, Scheme: "http", Interval: time.Millisecond}, res, nil),
				first:  []string{"10.0.0.1:8000", "10.0.0.2:8000"},
				leaves: "10.0.0.1:8000",
				remove: func() { res.set([]string{"10.0.0.2"}, nil) },
			}
		},
		"gpustack": func(t *testing.T) fixture {
			gs := &fakeGPUStack{instances: []gpustackInstance{
				{Name: "qwen-a", ModelName: "qwen", WorkerIP: "10.0.0.11", Port: 40001, State: "running"},
				{Name: "qwen-b", ModelName: "qwen", WorkerIP: "10.0.0.12", Port: 40001, State: "running"},
			}}
			srv := httptest.NewServer(gs)
			t.Cleanup(srv.Close)
			return fixture{
				src:    NewGPUStack(GPUStackConfig{URL: srv.URL, APIKey: "gpustack-key", Scheme: "http", Interval: time.Millisecond}, srv.Client(), nil),
				first:  []string{"qwen-a", "qwen-b"},
				leaves: "qwen-a",
				remove: func() {
					gs.mu.Lock()
					gs.instances[0].State = "stopping" // GPUStack is restarting it
					gs.mu.Unlock()
				},
			}
		},
	}
	for name, mk := range cases {
		t.Run(name, func(t *testing.T) {
			fx := mk(t)
			fleet := newFakeFleet()
			s := NewSyncer(fleet, "", time.Hour, nil)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- s.Run(ctx, fx.src, time.Millisecond, nil) }()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Run: %v", err)
				}
			}()
			waitFleet(t, fleet, fx.first...)

			fleet.mu.Lock()
			fleet.inFlight[fx.leaves] = 1 // a stream is running on it
			fleet.mu.Unlock()
			fx.remove()
			var draining []string
			for _, n := range fx.first {
				if n == fx.leaves {
					n += "(draining)"
				}
				draining = append(draining, n)
			}
			waitFleet(t, fleet, draining...)

			fleet.mu.Lock()
			fleet.inFlight[fx.leaves] = 0 // the stream finished
			fleet.mu.Unlock()
			waitFleet(t, fleet, slices.DeleteFunc(slices.Clone(fx.first), func(n string) bool { return n == fx.leaves })...)
		})
	}
}

// waitFleet waits until the fake fleet is exactly want. The deadline is
// generous (a stuck test fails with the state seen), not a timing assertion.
func waitFleet(t *testing.T, f *fakeFleet, want ...string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !slices.Equal(f.state(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("fleet %v, want %v", f.state(), want)
		}
		time.Sleep(time.Millisecond)
	}
}
