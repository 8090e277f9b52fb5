package main

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/llmlb/llmlb/internal/testutil/qwentok"
)

func TestValidateCommand(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("routing:\n  afinity: {}\nreplicas:\n  - localhost:8000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(dir, "secret.yaml")
	if err := os.WriteFile(secret, []byte("replicas:\n  - {url: \"http://a:8000\", api_key_env: LLMLB_TEST_KEY}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("LLMLB_TEST_KEY", "sk-example")
	invalid := filepath.Join(dir, "invalid.yaml")
	if err := os.WriteFile(invalid, []byte("replicas:\n  - {name: a, url: \"http://a:8000/v1\"}\n  - {name: a, url: \"http://b:8000\"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	mixed := filepath.Join(dir, "mixed.yaml")
	if err := os.WriteFile(mixed, []byte("routing:\n  afinity: {}\nreplicas:\n  - {url: \"localhost:8000\"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A tokenizer directory whose tokenizer.json llmlb cannot use.
	wordpiece := filepath.Join(dir, "bert")
	if err := os.MkdirAll(wordpiece, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(wordpiece, "tokenizer.json"), []byte(`{"model": {"type": "WordPiece"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	badTok := filepath.Join(dir, "badtok.yaml")
	if err := os.WriteFile(badTok, []byte("replicas:\n  - {url: \"http://a:8000\", kv_events: \"tcp://a:5557\"}\ntokenizers:\n  - {models: [bert], path: "+wordpiece+"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	qwen := qwentok.Dir(t)
	goodTok := filepath.Join(dir, "goodtok.yaml")
	if err := os.WriteFile(goodTok, []byte("replicas:\n  - {url: \"http://a:8000\", kv_events: \"tcp://a:5557\"}\ntokenizers:\n  - {models: [qwen], path: "+qwen+"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		args       []string
		wantErr    string // "" = success
		isHelp     bool
		wantStdout string // substring
		wantStderr []string
	}{
		{name: "example", args: []string{"--config", "../../examples/llmlb.yaml"}, wantStdout: "ok: 4 replicas, policy cost\n"},
		{name: "positional file and flags", args: []string{"--replica", "http://x:1", "../../examples/llmlb.yaml"}, wantStdout: "ok: 1 replicas, policy cost\n"},
		{name: "print redacts", args: []string{"--print", "--config", secret}, wantStdout: "api_key: <redacted>"},
		{name: "print ends with a comment", args: []string{"--print", "--config", "../../examples/llmlb.yaml"}, wantStdout: "\n# ok: 4 replicas, policy cost\n"},
		{name: "parse errors", args: []string{"--config", bad}, wantErr: "bad.yaml: 2 problem(s)", wantStderr: []string{
			`config: ` + bad + `: line 2: routing.afinity: unknown key (did you mean "affinity"?)`,
			`config: ` + bad + `: line 4: replicas[0]: "localhost:8000" is not an absolute http(s) URL (e.g. http://10.0.0.5:8000)`,
		}},
		{name: "parse and validation errors together, each once", args: []string{"--config", mixed}, wantErr: "mixed.yaml: 2 problem(s)", wantStderr: []string{
			`config: ` + mixed + `: line 2: routing.afinity: unknown key (did you mean "affinity"?)`,
			`config: replicas[0].url: "localhost:8000" is not an absolute http(s) URL (write e.g. http://10.0.0.5:8000)`,
		}},
		{name: "validation errors", args: []string{"--config", invalid}, wantErr: "invalid.yaml: 2 problem(s)", wantStderr: []string{
			`config: replicas[0].url: "http://a:8000/v1" ends in /v1; give the server's root (llmlb adds /v1/... and /metrics itself)`,
			`config: replicas[1].name: "a" is also the name of replicas[0]; names must be unique`,
		}},
		// docs/SECURITY.md [11]: a replica name that is not UTF-8 fails validate (it
		// used to pass and panic serve on the first scrape).
		{name: "non-UTF-8 replica name", args: []string{"--replica", "gpu\xff=http://127.0.0.1:8000", "--config", "../../examples/llmlb.yaml"},
			wantErr: "1 problem(s)", wantStderr: []string{
				`config: replicas[0].name: "gpu\xff" has a forbidden character at byte 3: names are letters, digits and . _ : - (it appears in headers, metrics and admin URLs)`,
			}},
		// docs/SECURITY.md [13]: an admin listener on the network without a token is
		// valid but said loudly.
		{name: "admin on the network without a token", args: []string{"--admin-listen", "0.0.0.0:9090", "--config", secret},
			wantStdout: "ok: 1 replicas", wantStderr: []string{
				`warning: admin_listen "0.0.0.0:9090" is reachable from the network and admin_token is not set: /admin/replicas, /admin/pins (session ids) and /metrics are readable by anyone who can connect (mutations stay disabled); set admin_token or listen on 127.0.0.1`,
			}},
		{name: "missing file", args: []string{"--config", filepath.Join(dir, "nope.yaml")}, wantErr: "1 problem(s)"},
		{name: "a tokenizer serve cannot use", args: []string{"--config", badTok}, wantErr: "badtok.yaml: 1 problem(s)", wantStderr: []string{
			`tokenizers[0]: modeltok: ` + filepath.Join(wordpiece, "tokenizer.json") + `: hftok: pre_tokenizer is null; only byte-level BPE is supported`,
		}},
		{name: "a tokenizer, described", args: []string{"--config", goodTok},
			wantStdout: "tokenizer qwen (" + qwen + "): chat template, content as a string, developer messages as system ones\n"},
		{name: "no config", args: nil, wantErr: "--config FILE is required"},
		{name: "help", args: []string{"-h"}, isHelp: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := validateMain(tt.args, &stdout, &stderr)
			switch {
			case tt.isHelp:
				if !errors.Is(err, flag.ErrHelp) {
					t.Fatalf("err = %v, want flag.ErrHelp", err)
				}
				return
			case tt.wantErr == "" && err != nil:
				t.Fatalf("err = %v; stderr:\n%s", err, stderr.String())
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
			if !strings.Contains(stdout.String(), tt.wantStdout) {
				t.Errorf("stdout = %q, want it to contain %q", stdout.String(), tt.wantStdout)
			}
			for _, line := range tt.wantStderr {
				if !strings.Contains(stderr.String(), line+"\n") {
					t.Errorf("stderr lacks %q:\n%s", line, stderr.String())
				}
			}
			if strings.Contains(stdout.String()+stderr.String(), "sk-example") {
				t.Error("a secret was printed")
			}
		})
	}
}

// TestValidateReadsWhatServeReads: validate takes serve's --policy and
// --log-level and the same LLMLB_* environment, runs without a file when
// they say what to serve (as serve does), and routing.policy in the file
// accepts the other routers' names that --policy does.
func TestValidateReadsWhatServeReads(t *testing.T) {
	dir := t.TempDir()
	aliased := filepath.Join(dir, "aliased.yaml")
	if err := os.WriteFile(aliased, []byte("routing:\n  policy: cache_aware\nreplicas:\n  - http://a:8000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	example := "../../examples/llmlb.yaml"
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    string // stdout substring
		wantErr string
	}{
		{"the example's policy is the default", []string{example}, nil, "policy cost\n", ""},
		{"an alias in the file", []string{aliased}, nil, "policy prefix-tree\n", ""},
		{"LLMLB_POLICY", []string{example}, map[string]string{"LLMLB_POLICY": "rr"}, "policy rr\n", ""},
		{"LLMLB_POLICY as an alias", []string{example}, map[string]string{"LLMLB_POLICY": "least_request"}, "policy least-request\n", ""},
		{"--policy wins over LLMLB_POLICY", []string{"--policy", "sticky", example}, map[string]string{"LLMLB_POLICY": "rr"}, "policy sticky\n", ""},
		{"LLMLB_CONFIG", nil, map[string]string{"LLMLB_CONFIG": example}, "ok: 4 replicas, policy cost\n", ""},
		{"LLMLB_REPLICA", []string{example}, map[string]string{"LLMLB_REPLICA": "http://x:1,http://y:1"}, "ok: 2 replicas", ""},
		{"no file: serve's flags alone, as serve runs", []string{"--replica", "a=http://x:1", "--policy", "rr"}, nil, "ok: 1 replicas, policy rr\n", ""},
		{"no file: LLMLB_REPLICA alone", nil, map[string]string{"LLMLB_REPLICA": "http://x:1,http://y:1"}, "ok: 2 replicas, policy cost\n", ""},
		{"no file: a bad flag is named", []string{"--replica", "a=ftp://x:1"}, nil, "", "flags: 1 problem(s)"},
		{"a policy llmlb lacks", []string{example}, map[string]string{"LLMLB_POLICY": "random"}, "", "no equivalent policy"},
		{"a bad LLMLB_LOG_LEVEL", []string{example}, map[string]string{"LLMLB_LOG_LEVEL": "loud"}, "", "problem(s)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			lookup := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			err := validateEnv(tc.args, &stdout, &stderr, lookup)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error()+stderr.String(), tc.wantErr) {
					t.Fatalf("err = %v (stderr %q), want %q", err, stderr.String(), tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("err = %v; stderr:\n%s", err, stderr.String())
			}
			if !strings.Contains(stdout.String(), tc.want) {
				t.Fatalf("stdout = %q, want %q", stdout.String(), tc.want)
			}
		})
	}
}
