package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/simreplica"
)

func TestParseFaultFlags(t *testing.T) {
	tests := []struct {
		specs   []string
		all     simreplica.Mode
		per     map[string]simreplica.Mode
		wantErr bool
	}{
		{specs: nil, all: simreplica.None, per: map[string]simreplica.Mode{}},
		{specs: []string{"hang"}, all: simreplica.Hang, per: map[string]simreplica.Mode{}},
		{specs: []string{"error:rate=0.5,status=502"}, all: simreplica.Error, per: map[string]simreplica.Mode{}},
		{specs: []string{"sim-2=refuse", "slow:factor=2"}, all: simreplica.Slow, per: map[string]simreplica.Mode{"sim-2": simreplica.Refuse}},
		{specs: []string{"sim-3=flap:period=1s"}, all: simreplica.None, per: map[string]simreplica.Mode{"sim-3": simreplica.Flap}},
		{specs: []string{"sim-9=refuse"}, wantErr: true},
		{specs: []string{"explode"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.specs, " "), func(t *testing.T) {
			all, per, err := parseFaultFlags(tt.specs, 3)
			if (err != nil) != tt.wantErr {
				t.Fatalf("error = %v, wantErr %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if all.Mode != tt.all || len(per) != len(tt.per) {
				t.Fatalf("all %v per %v, want %v %v", all, per, tt.all, tt.per)
			}
			for name, m := range tt.per {
				if per[name].Mode != m {
					t.Errorf("%s: %v, want %v", name, per[name], m)
				}
			}
		})
	}
}

func TestSimHelpAndBadFlags(t *testing.T) {
	if err := simMain(context.Background(), []string{"-h"}, io.Discard, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v, want flag.ErrHelp", err)
	}
	for _, args := range [][]string{{"--replicas", "0"}, {"--profile", "nope"}, {"--fault", "explode"}, {"extra"}, {"--tokenizer", "/nonexistent/model"}} {
		if err := simMain(context.Background(), args, io.Discard, io.Discard); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

func TestSimRunsAndStops(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- simMain(ctx, []string{"--listen", "127.0.0.1:0", "--replicas", "2", "--profile", "h100", "--fault", "sim-2=refuse"}, pw, io.Discard)
		pw.Close()
	}()
	// Read the startup banner: one line per replica with its URL and control URL.
	urls := map[string][]string{}
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "Ctrl-C") {
			break
		}
		if f := strings.Fields(line); len(f) >= 4 && strings.HasPrefix(f[0], "sim-") {
			urls[f[0]] = f[1:]
		}
	}
	go io.Copy(io.Discard, pr)
	if len(urls) != 2 {
		t.Fatalf("banner listed %v", urls)
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{}}
	resp, err := client.Get(urls["sim-1"][0] + "/health")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("sim-1 health: %v", err)
	}
	resp.Body.Close()
	if _, err := client.Get(urls["sim-2"][0] + "/health"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("sim-2 started with --fault sim-2=refuse answered: %v", err)
	}
	resp, err = client.Post(urls["sim-2"][2], "application/json", strings.NewReader(`{"mode":"recover"}`))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("recover sim-2 through its control URL %s: %v", urls["sim-2"][2], err)
	}
	resp.Body.Close()
	resp, err = client.Get(urls["sim-2"][0] + "/health")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("sim-2 health after recover: %v", err)
	}
	resp.Body.Close()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("simMain: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("simMain did not stop after cancel")
	}
}
