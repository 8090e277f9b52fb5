package workload

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/tokenize"
)

// tracePath finds a sample trace in the repository's traces/ (or
// $LLMLB_TRACES, to try others); the repository's are always there.
func tracePath(t testing.TB, name string) string {
	t.Helper()
	dir := os.Getenv("LLMLB_TRACES")
	if dir == "" {
		dir = filepath.Join("..", "..", "traces")
	}
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("sample trace %s: %v", p, err)
	}
	return p
}

func TestSampleTraces(t *testing.T) {
	tests := []struct {
		file       string
		count      int
		meanInput  float64
		meanOutput float64
		span       time.Duration // last arrival, roughly
		sharing    bool
	}{
		// Figures from traces/README.md.
		{"mooncake_synthetic_trace.jsonl", 3993, 15325.48, 149.12, 17 * time.Minute, true},
		{"azure_llm_inference_2023_code.csv", 8819, 2047.85, 27.88, 57 * time.Minute, false},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			w, err := OpenTrace(tracePath(t, tt.file), "", TraceOptions{})
			if err != nil {
				t.Fatal(err)
			}
			reqs := drive(t, w, fixed(time.Second))
			if len(reqs) != tt.count {
				t.Fatalf("%d requests, want %d", len(reqs), tt.count)
			}
			in, out := 0, 0
			firstBlock := map[uint64]int{}
			for _, r := range reqs {
				in += r.Prompt.Tokens
				out += r.Output
				if len(r.Prompt.Blocks) > 0 {
					firstBlock[r.Prompt.Blocks[0]]++
				}
				if r.Session != "" || r.Profile.SessionKey != "" {
					t.Fatalf("request %d has a session %q: the trace has none", r.ID, r.Session)
				}
			}
			n := float64(len(reqs))
			if got := float64(in) / n; !within(got, tt.meanInput, 0.0001) {
				t.Errorf("mean input %.2f, want %.2f", got, tt.meanInput)
			}
			if got := float64(out) / n; !within(got, tt.meanOutput, 0.01) {
				t.Errorf("mean output %.2f, want %.2f", got, tt.meanOutput)
			}
			if last := reqs[len(reqs)-1].At; !within(last.Seconds(), tt.span.Seconds(), 0.05) {
				t.Errorf("last arrival at %v, want ~%v", last, tt.span)
			}
			if shared := len(firstBlock) < len(reqs)*9/10; shared != tt.sharing {
				t.Errorf("%d distinct first blocks in %d requests; sharing=%v, want %v", len(firstBlock), len(reqs), shared, tt.sharing)
			}
		})
	}
}

func TestTraceOptions(t *testing.T) {
	path := tracePath(t, "azure_llm_inference_2023_code.csv")
	all, err := OpenTrace(path, "azure", TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	base := drive(t, all, fixed(time.Second))
	tests := []struct {
		name  string
		opt   TraceOptions
		count int
		scale float64 // arrival offsets relative to the full replay
	}{
		{"limit", TraceOptions{Limit: 100}, 100, 1},
		{"speed 2", TraceOptions{Speed: 2}, len(base), 0.5},
		{"duration", TraceOptions{Duration: 10 * time.Minute}, countBefore(base, 10*time.Minute), 1},
		{"speed and duration", TraceOptions{Speed: 4, Duration: 10 * time.Minute}, countBefore(base, 40*time.Minute), 0.25},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := OpenTrace(path, "", tt.opt)
			if err != nil {
				t.Fatal(err)
			}
			reqs := drive(t, w, fixed(time.Second))
			if len(reqs) != tt.count {
				t.Fatalf("%d requests, want %d", len(reqs), tt.count)
			}
			for i, r := range reqs {
				want := time.Duration(float64(base[i].At) * tt.scale)
				if d := r.At - want; d < -time.Microsecond || d > time.Microsecond {
					t.Fatalf("request %d at %v, want %v", i, r.At, want)
				}
			}
		})
	}
}

func countBefore(reqs []*Request, d time.Duration) int {
	n := 0
	for _, r := range reqs {
		if r.At < d {
			n++
		}
	}
	return n
}

func TestMooncakeBlockMapping(t *testing.T) {
	// Four requests: two full 512-blocks; the same two ids on a prompt whose
	// second block is partial; the same first id; an unrelated short prompt.
	const trace = `{"timestamp": 0, "input_length": 1024, "output_length": 10, "hash_ids": [7, 8]}
{"timestamp": 1500, "input_length": 1000, "output_length": 0, "hash_ids": [7, 8]}

{"timestamp": 2000, "input_length": 700, "output_length": 5, "hash_ids": [7, 9]}
{"timestamp": 2500, "input_length": 300, "output_length": 5, "hash_ids": [10]}
`
	w, err := ReadMooncake(strings.NewReader(trace), TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reqs := drive(t, w, fixed(time.Second))
	if len(reqs) != 4 {
		t.Fatalf("%d requests, want 4", len(reqs))
	}
	a, b, c, d := reqs[0], reqs[1], reqs[2], reqs[3]
	const per = MooncakeBlockTokens / tokenize.BlockSize
	tests := []struct {
		name string
		x, y *Request
		want int
	}{
		{"same ids, partial second block shares only the first", a, b, per},
		{"same first id", a, c, per},
		{"partial blocks never match each other", b, c, per},
		{"different first id", a, d, 0},
	}
	for _, tt := range tests {
		if got := sharedBlocks(tt.x.Prompt.Blocks, tt.y.Prompt.Blocks); got != tt.want {
			t.Errorf("%s: %d shared blocks, want %d", tt.name, got, tt.want)
		}
	}
	if len(a.Prompt.Blocks) != 64 || len(b.Prompt.Blocks) != 62 || len(d.Prompt.Blocks) != 18 {
		t.Errorf("block counts %d, %d, %d; want 64, 62, 18", len(a.Prompt.Blocks), len(b.Prompt.Blocks), len(d.Prompt.Blocks))
	}
	if b.At != 1500*time.Millisecond || b.Output != 1 {
		t.Errorf("second request at %v with output %d, want 1.5s and 1 (a zero output is generated as one token)", b.At, b.Output)
	}
	// Prefix keys: the first two full 512-blocks, as the first 4096 characters.
	if a.Profile.PrefixKey == b.Profile.PrefixKey || a.Profile.PrefixKey == c.Profile.PrefixKey || b.Profile.PrefixKey != c.Profile.PrefixKey {
		t.Errorf("prefix keys %q %q %q: want a alone, b and c equal (one full block, id 7)", a.Profile.PrefixKey, b.Profile.PrefixKey, c.Profile.PrefixKey)
	}
	if d.Profile.PrefixKey == "" || d.Profile.PrefixKey == a.Profile.PrefixKey {
		t.Errorf("short prompt's prefix key %q, want one of its own", d.Profile.PrefixKey)
	}
}

func TestTraceReadersRejectBadInput(t *testing.T) {
	tests := []struct {
		name, format, text, wantErr string
	}{
		{"mooncake not json", "mooncake", "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1}\nnot json\n", "mooncake line 2"},
		{"mooncake missing field", "mooncake", `{"timestamp": 0, "input_length": 10}`, "are required"},
		{"mooncake zero input", "mooncake", `{"timestamp": 0, "input_length": 0, "output_length": 1}`, "input_length 0"},
		{"mooncake negative output", "mooncake", `{"timestamp": 0, "input_length": 5, "output_length": -1}`, "output_length -1"},
		{"mooncake huge input", "mooncake", `{"timestamp": 0, "input_length": 1000000000000, "output_length": 1}`, "input_length 1000000000000"},
		{"mooncake huge timestamp", "mooncake", `{"timestamp": 1e300, "input_length": 5, "output_length": 1}`, "bad timestamp"},
		{"mooncake negative timestamp", "mooncake", `{"timestamp": -5, "input_length": 5, "output_length": 1}`, "bad timestamp"},
		{"mooncake empty", "mooncake", "\n\n", "no requests"},
		{"azure no header columns", "azure", "a,b,c\n1,2,3\n", "lacks a TIMESTAMP column (want TIMESTAMP,ContextTokens,GeneratedTokens)"},
		{"azure bad time", "azure", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,5,5\n", "azure line 2: bad TIMESTAMP"},
		{"azure huge context", "azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,99999999999,5\n", "ContextTokens \"99999999999\""},
		{"azure bad tokens", "azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,x,5\n", "ContextTokens \"x\""},
		{"azure short row", "azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,5\n", "2 fields"},
		{"azure empty", "azure", "", "reading the header"},
		{"azure rows centuries apart", "azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n5000-01-01 00:00:00,10,1\n0001-01-01 00:00:00,10,1\n9999-01-01 00:00:00,10,1\n", "azure line 3: TIMESTAMP \"0001-01-01 00:00:00\" is more than"},
		{"azure bad quoting", "azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,\"5,5\n", "azure: parse error on line 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			read := ReadMooncake
			if tt.format == "azure" {
				read = ReadAzure
			}
			checkRejects(t, read, tt.text, tt.wantErr)
		})
	}
	for _, opt := range []TraceOptions{{Speed: -1}, {Duration: -time.Second}, {Limit: -1}} {
		if _, err := ReadAzure(strings.NewReader("TIMESTAMP,ContextTokens,GeneratedTokens\n"), opt); err == nil {
			t.Errorf("options %+v accepted", opt)
		}
	}
}

func TestAzureTimestampsAreOffsetsFromTheFirst(t *testing.T) {
	const csv = "TIMESTAMP,ContextTokens,GeneratedTokens\n" +
		"2023-11-16 18:17:05.5000000,100,3\n" +
		"2023-11-16 18:17:03.9799600,40,0\n" +
		"2023-11-16 18:17:04.0000000,20,1\n"
	w, err := ReadAzure(strings.NewReader(csv), TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reqs := drive(t, w, fixed(time.Second))
	want := []time.Duration{0, 20040 * time.Microsecond, 1520040 * time.Microsecond}
	for i, r := range reqs {
		if r.At != want[i] {
			t.Errorf("request %d at %v, want %v", i, r.At, want[i])
		}
	}
	if sharedBlocks(reqs[0].Prompt.Blocks, reqs[2].Prompt.Blocks) != 0 || len(reqs[2].Prompt.Blocks) != 6 {
		t.Errorf("azure prompts share blocks or have the wrong length")
	}
}

func TestParseAzureTime(t *testing.T) {
	utc := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	tests := []struct {
		name, in string
		want     time.Time
	}{
		{"2023: no zone, seven-digit fraction", "2023-11-16 18:17:03.9799600", utc("2023-11-16T18:17:03.97996Z")},
		{"no fraction", "2023-11-16 18:17:03", utc("2023-11-16T18:17:03Z")},
		{"2024: UTC offset", "2024-05-10 00:00:00.009930+00:00", utc("2024-05-10T00:00:00.00993Z")},
		{"negative offset", "2024-05-10 00:00:00.009930-07:00", utc("2024-05-10T07:00:00.00993Z")},
		{"positive offset", "2024-05-10 09:30:00+09:30", utc("2024-05-10T00:00:00Z")},
		{"T and offset", "2024-05-10T00:00:00.009930+00:00", utc("2024-05-10T00:00:00.00993Z")},
		{"T and Z", "2024-05-10T00:00:00.009930Z", utc("2024-05-10T00:00:00.00993Z")},
		{"space and Z", "2024-05-10 00:00:00Z", utc("2024-05-10T00:00:00Z")},
		{"T, no zone", "2024-05-10T00:00:00.5", utc("2024-05-10T00:00:00.5Z")},
		{"seconds", "12.5", time.Unix(12, 5e8)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseAzureTime(tt.in)
			if err != nil || !got.Equal(tt.want) {
				t.Errorf("parseAzureTime(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
			}
		})
	}
	for _, in := range []string{"yesterday", "2024-05-10", "2024-05-10 00:00:00 +00:00", "2024-05-10 00:00:00+0000", "2024-05-10 00:00:00z", "2024-05-10 25:00:00", "-5", "NaN"} {
		_, err := parseAzureTime(in)
		if err == nil || !strings.Contains(err.Error(), "bad TIMESTAMP") || !strings.Contains(err.Error(), "Z or +hh:mm") {
			t.Errorf("parseAzureTime(%q): error %v, want one listing the accepted forms", in, err)
		}
	}
}

func TestAzureOffsetsAreAbsolute(t *testing.T) {
	// The same instants written with different offsets (and a 2023-style row
	// without one, read as UTC): 00:00:00.5, 00:00:00, 00:00:01 and
	// 00:00:02 UTC.
	const csv = "TIMESTAMP,ContextTokens,GeneratedTokens\n" +
		"2024-05-10 02:00:00.5+02:00,10,1\n" +
		"2024-05-09T23:00:00-01:00,20,1\n" +
		"2024-05-10T00:00:01Z,30,1\n" +
		"2024-05-10 00:00:02,40,1\n"
	w, err := ReadAzure(strings.NewReader(csv), TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reqs := drive(t, w, fixed(time.Second))
	want := []struct {
		at    time.Duration
		input int
	}{{0, 20}, {500 * time.Millisecond, 10}, {time.Second, 30}, {2 * time.Second, 40}}
	if len(reqs) != len(want) {
		t.Fatalf("%d requests, want %d", len(reqs), len(want))
	}
	for i, r := range reqs {
		if r.At != want[i].at || r.Prompt.Tokens != want[i].input {
			t.Errorf("request %d: %d tokens at %v, want %d at %v", i, r.Prompt.Tokens, r.At, want[i].input, want[i].at)
		}
	}
}

func TestOpenTraceFormat(t *testing.T) {
	dir := t.TempDir()
	txt := filepath.Join(dir, "trace.txt")
	if err := os.WriteFile(txt, []byte(`{"timestamp": 0, "input_length": 10, "output_length": 1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenTrace(txt, "", TraceOptions{}); !errors.Is(err, ErrUnknownFormat) {
		t.Errorf("unknown extension: %v, want ErrUnknownFormat", err)
	}
	if _, err := OpenTrace(txt, "jsonl", TraceOptions{}); !errors.Is(err, ErrUnknownFormat) {
		t.Errorf("format jsonl (an extension, not a format): %v, want ErrUnknownFormat", err)
	}
	if _, err := OpenTrace(txt, "sharegpt", TraceOptions{}); !errors.Is(err, ErrUnknownFormat) {
		t.Errorf("unknown format: %v, want ErrUnknownFormat", err)
	}
	if w, err := OpenTrace(txt, "mooncake", TraceOptions{}); err != nil || w == nil {
		t.Errorf("named format: %v", err)
	}
	if _, err := OpenTrace(filepath.Join(dir, "missing.jsonl"), "", TraceOptions{}); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

// checkRejects reads text with read and wants no workload and an error
// that starts with "workload: " and contains want.
func checkRejects(t *testing.T, read func(io.Reader, TraceOptions) (Workload, error), text, want string) {
	t.Helper()
	w, err := read(strings.NewReader(text), TraceOptions{})
	if err == nil || w != nil {
		t.Fatalf("got %v, %v; want an error", w, err)
	}
	if !strings.HasPrefix(err.Error(), "workload: ") || !strings.Contains(err.Error(), want) {
		t.Errorf("error %q, want %q", err, want)
	}
}

func FuzzReadMooncake(f *testing.F) {
	f.Add(`{"timestamp": 0, "input_length": 1024, "output_length": 10, "hash_ids": [7, 8]}`)
	f.Add("{\"timestamp\": 5.5, \"input_length\": 3, \"output_length\": 0}\n\n{}")
	f.Fuzz(func(t *testing.T, text string) {
		checkReplay(t, ReadMooncake, text, TraceOptions{}, nil)
		checkReplay(t, ReadMooncake, text, TraceOptions{Speed: 0.5, Duration: 10 * time.Second, Limit: 3}, nil) // cut while read (traceCut)
	})
}

// checkReplay reads text with read and, if it is accepted, checks every
// request it replays: a non-negative arrival, at least one prompt and one
// output token, one block per 16 prompt tokens, and whatever extra asks.
func checkReplay(t *testing.T, read func(io.Reader, TraceOptions) (Workload, error), text string, opt TraceOptions, extra func(*Request) bool) {
	t.Helper()
	w, err := read(strings.NewReader(text), opt)
	if err != nil {
		return
	}
	for !w.Done() {
		r := w.Pop()
		if r.At < 0 || r.Prompt.Tokens < 1 || r.Output < 1 || len(r.Prompt.Blocks) != r.Prompt.Tokens/tokenize.BlockSize ||
			extra != nil && !extra(r) {
			t.Fatalf("bad request %+v", r)
		}
	}
}

func FuzzReadBailian(f *testing.F) {
	f.Add(`{"chat_id": 1, "parent_chat_id": -1, "timestamp": 61.114, "input_length": 521, "output_length": 132, "type": "text", "turn": 1, "hash_ids": [1089, 1090]}` + "\n" +
		`{"chat_id": 2, "parent_chat_id": 1, "timestamp": 62.5, "input_length": 40, "output_length": 0, "turn": 2, "hash_ids": [1089]}`)
	f.Add("{\"chat_id\": 7, \"parent_chat_id\": 7, \"timestamp\": 0, \"input_length\": 3, \"output_length\": 1}\n\n{}")
	f.Fuzz(func(t *testing.T, text string) {
		checkReplay(t, ReadBailian, text, TraceOptions{Speed: 2}, func(r *Request) bool {
			return r.Profile.SessionKey != "" && r.Turn >= 1
		})
		checkReplay(t, ReadBailian, text, TraceOptions{Speed: 0.5, Duration: 10 * time.Second, Limit: 3}, func(r *Request) bool {
			return r.Profile.SessionKey != "" && r.Turn >= 1
		})
	})
}

func FuzzReadAzure(f *testing.F) {
	f.Add("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4808,10\n")
	f.Add("GeneratedTokens,TIMESTAMP,ContextTokens\n1,12.5,7\n")
	f.Add("TIMESTAMP,ContextTokens,GeneratedTokens\n5000-01-01 00:00:00,10,1\n0001-01-01 00:00:00,10,1\n")
	f.Fuzz(func(t *testing.T, text string) {
		checkReplay(t, ReadAzure, text, TraceOptions{Speed: 3}, nil)
		checkReplay(t, ReadAzure, text, TraceOptions{Speed: 0.5, Duration: 10 * time.Second, Limit: 3}, nil) // cut while read (traceCut)
	})
}

func TestMooncakeSampleReuse(t *testing.T) {
	// The traces README: 64% of the sample's 512-token blocks repeat; mapped
	// onto 16-token blocks (partial blocks never repeat) the share stays close.
	w, err := OpenTrace(tracePath(t, "mooncake_synthetic_trace.jsonl"), "", TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[uint64]bool{}
	repeated, total := 0, 0
	for !w.Done() {
		for _, b := range w.Pop().Prompt.Blocks {
			total++
			if seen[b] {
				repeated++
			}
			seen[b] = true
		}
	}
	if share := float64(repeated) / float64(total); share < 0.60 || share > 0.68 {
		t.Errorf("%.3f of blocks repeat, want ~0.64", share)
	}
}

func TestBailianTrace(t *testing.T) {
	// Conversation 1: chat 1, then 2 (parent 1), then 4 (parent 2); chat 3
	// starts another; chat 9's parent 8 began before the trace; chat 10
	// repeats chat 1's ids after a different first one.
	const trace = `{"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.5, "input_length": 40, "output_length": 7, "type": "text", "turn": 1, "hash_ids": [11, 12, 13]}
{"chat_id": 2, "parent_chat_id": 1, "timestamp": 2.25, "input_length": 64, "output_length": 0, "type": "text", "turn": 2, "hash_ids": [11, 12, 13, 14]}

{"chat_id": 3, "parent_chat_id": -1, "timestamp": 3, "input_length": 32, "output_length": 5, "type": "search", "turn": 1, "hash_ids": [21, 22]}
{"chat_id": 4, "parent_chat_id": 2, "timestamp": 4, "input_length": 80, "output_length": 5, "type": "text", "turn": 3, "hash_ids": [11, 12, 13, 14, 15]}
{"chat_id": 9, "parent_chat_id": 8, "timestamp": 5, "input_length": 16, "output_length": 5, "type": "text", "turn": 4, "hash_ids": [31]}
{"chat_id": 10, "parent_chat_id": -1, "timestamp": 6, "input_length": 48, "output_length": 5, "type": "text", "hash_ids": [99, 12, 13]}
`
	w, err := ReadBailian(strings.NewReader(trace), TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reqs := drive(t, w, fixed(time.Second))
	if len(reqs) != 6 {
		t.Fatalf("%d requests, want 6", len(reqs))
	}
	c1, c2, c3, c4, c9, c10 := reqs[0], reqs[1], reqs[2], reqs[3], reqs[4], reqs[5]
	if c1.At != 0 || c2.At != 1750*time.Millisecond || c4.At != 3500*time.Millisecond {
		t.Errorf("arrivals %v %v %v, want 0, 1.75s, 3.5s (timestamps are seconds, offsets from the first)", c1.At, c2.At, c4.At)
	}
	tests := []struct {
		name string
		x, y *Request
		want int
	}{
		{"the next turn holds the whole earlier prompt (its partial block excepted)", c1, c2, 2},
		{"a later turn extends the one before", c2, c4, 4},
		{"another conversation shares nothing", c1, c3, 0},
		{"equal ids after a different first one share nothing (chained)", c1, c10, 0},
	}
	for _, tt := range tests {
		if got := sharedBlocks(tt.x.Prompt.Blocks, tt.y.Prompt.Blocks); got != tt.want {
			t.Errorf("%s: %d shared blocks, want %d", tt.name, got, tt.want)
		}
	}
	if len(c1.Prompt.Blocks) != 2 || len(c4.Prompt.Blocks) != 5 {
		t.Errorf("block counts %d and %d, want 2 and 5 (16-token blocks)", len(c1.Prompt.Blocks), len(c4.Prompt.Blocks))
	}
	if c1.Profile.SessionKey == "" || c1.Profile.SessionKey != c2.Profile.SessionKey || c2.Profile.SessionKey != c4.Profile.SessionKey {
		t.Errorf("session keys %q %q %q, want one conversation", c1.Profile.SessionKey, c2.Profile.SessionKey, c4.Profile.SessionKey)
	}
	if c3.Profile.SessionKey == c1.Profile.SessionKey || c9.Profile.SessionKey == c1.Profile.SessionKey || c10.Profile.SessionKey == c1.Profile.SessionKey {
		t.Errorf("other conversations share session key %q", c1.Profile.SessionKey)
	}
	if c4.Session != c4.Profile.SessionKey || c4.Turn != 3 || c10.Turn != 1 {
		t.Errorf("chat 4: session %q turn %d; chat 10 turn %d; want its key, 3 and 1", c4.Session, c4.Turn, c10.Turn)
	}
	if c2.Output != 1 {
		t.Errorf("zero output generated as %d tokens, want 1", c2.Output)
	}
	// Prefix keys cover the first 1,024 tokens: chats 1, 2 and 4 differ
	// (their prompts are shorter, so the keys cover different lengths).
	if c1.Profile.PrefixKey == "" || c1.Profile.PrefixKey == c3.Profile.PrefixKey || c1.Profile.PrefixKey == c10.Profile.PrefixKey {
		t.Errorf("prefix keys %q %q %q, want three different", c1.Profile.PrefixKey, c3.Profile.PrefixKey, c10.Profile.PrefixKey)
	}
}

func TestBailianPrefixKeyCoversTheFirst1024Tokens(t *testing.T) {
	ids := func(first, n int) string {
		s := make([]string, n)
		for i := range s {
			s[i] = strconv.Itoa(first + i)
		}
		return strings.Join(s, ", ")
	}
	// Two prompts equal in their first 64 blocks, then different; a third
	// differs in block 64 (0-based 63).
	trace := fmt.Sprintf(`{"chat_id": 1, "timestamp": 0, "input_length": 1600, "output_length": 1, "hash_ids": [%s]}
{"chat_id": 2, "timestamp": 1, "input_length": 1600, "output_length": 1, "hash_ids": [%s, %s]}
{"chat_id": 3, "timestamp": 2, "input_length": 1600, "output_length": 1, "hash_ids": [%s, 7777, %s]}
`, ids(0, 100), ids(0, 64), ids(500, 36), ids(0, 63), ids(64, 36))
	w, err := ReadBailian(strings.NewReader(trace), TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reqs := drive(t, w, fixed(time.Second))
	if reqs[0].Profile.PrefixKey != reqs[1].Profile.PrefixKey {
		t.Errorf("equal first 1,024 tokens, prefix keys %q and %q", reqs[0].Profile.PrefixKey, reqs[1].Profile.PrefixKey)
	}
	if reqs[0].Profile.PrefixKey == reqs[2].Profile.PrefixKey {
		t.Errorf("different 64th block, same prefix key %q", reqs[0].Profile.PrefixKey)
	}
	if reqs[0].Profile.SessionKey == reqs[1].Profile.SessionKey {
		t.Errorf("two first requests share session key %q", reqs[0].Profile.SessionKey)
	}
}

func TestBailianRejectsBadInput(t *testing.T) {
	tests := []struct{ name, text, wantErr string }{
		{"not json", `{"chat_id": 1, "timestamp": 0, "input_length": 10, "output_length": 1}` + "\nnope\n", "bailian line 2"},
		{"no chat_id", `{"timestamp": 0, "input_length": 10, "output_length": 1}`, "chat_id, timestamp"},
		{"bad timestamp", `{"chat_id": 1, "timestamp": -1, "input_length": 10, "output_length": 1}`, "bad timestamp -1"},
		{"zero input", `{"chat_id": 1, "timestamp": 0, "input_length": 0, "output_length": 1}`, "input_length 0"},
		{"negative output", `{"chat_id": 1, "timestamp": 0, "input_length": 5, "output_length": -2}`, "output_length -2"},
		{"parent loop", `{"chat_id": 1, "parent_chat_id": 2, "timestamp": 0, "input_length": 5, "output_length": 1}` + "\n" +
			`{"chat_id": 2, "parent_chat_id": 1, "timestamp": 1, "input_length": 5, "output_length": 1}`, "loops"},
		{"empty", "\n", "no requests"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkRejects(t, ReadBailian, tt.text, tt.wantErr)
		})
	}
}

// writeFile writes text to dir/name and returns its path.
func writeFile(t *testing.T, dir, name, text string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestOpenTraceTellsBailianFromMooncake(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string { return writeFile(t, dir, name, text) }
	// The same numbers in both formats: Bailian's timestamps are seconds,
	// Mooncake's milliseconds.
	bailian := write("qwen.jsonl", "\n"+`{"chat_id": 5, "parent_chat_id": -1, "timestamp": 0, "input_length": 32, "output_length": 1, "hash_ids": [1, 2]}`+"\n"+
		`{"chat_id": 6, "parent_chat_id": 5, "timestamp": 3, "input_length": 32, "output_length": 1, "hash_ids": [1, 2]}`+"\n")
	mooncake := write("mc.jsonl", `{"timestamp": 0, "input_length": 32, "output_length": 1, "hash_ids": [1]}`+"\n"+
		`{"timestamp": 3, "input_length": 32, "output_length": 1, "hash_ids": [1]}`+"\n")
	for _, tt := range []struct {
		path, format string
		gap          time.Duration
		session      bool
	}{
		{bailian, "", 3 * time.Second, true},
		{bailian, "bailian", 3 * time.Second, true},
		{mooncake, "", 3 * time.Millisecond, false},
		{bailian, "mooncake", 3 * time.Millisecond, false}, // a named format is obeyed
	} {
		w, err := OpenTrace(tt.path, tt.format, TraceOptions{})
		if err != nil {
			t.Fatalf("%s as %q: %v", tt.path, tt.format, err)
		}
		reqs := drive(t, w, fixed(time.Second))
		if got := reqs[1].At - reqs[0].At; got != tt.gap || (reqs[1].Profile.SessionKey != "") != tt.session {
			t.Errorf("%s as %q: gap %v, session %q; want %v, session %v", filepath.Base(tt.path), tt.format, got, reqs[1].Profile.SessionKey, tt.gap, tt.session)
		}
	}
}

// TestReplaySharesTheRecords: replays of one trace read (Replay), run at
// once as bench runs its policies, each give the trace's every request from
// the start, the same as reading the file again; the template's own
// progress does not matter.
func TestReplaySharesTheRecords(t *testing.T) {
	path := tracePath(t, "mooncake_synthetic_trace.jsonl")
	opt := TraceOptions{Limit: 300}
	fresh, err := OpenTrace(path, "", opt)
	if err != nil {
		t.Fatal(err)
	}
	want := drive(t, fresh, fixed(time.Second))
	tmpl, err := OpenTrace(path, "", opt)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.Pop() // the template part-way through
	synthetic, err := New("oneshot", Params{Seed: 1, Duration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := Replay(synthetic); ok {
		t.Error("Replay of a synthetic workload: ok, want false")
	}
	got := make([][]*Request, 4)
	var wg sync.WaitGroup
	for i := range got {
		w, ok := Replay(tmpl)
		if !ok {
			t.Fatal("Replay of a trace: not ok")
		}
		wg.Go(func() { got[i] = drive(t, w, fixed(time.Second)) })
	}
	wg.Wait()
	for i, reqs := range got {
		if len(reqs) != len(want) {
			t.Fatalf("replay %d: %d requests, want %d", i, len(reqs), len(want))
		}
		for j, r := range reqs {
			w := want[j]
			if r.At != w.At || r.Prompt.Tokens != w.Prompt.Tokens || r.Output != w.Output || r.Profile.PrefixKey != w.Profile.PrefixKey || !slices.Equal(r.Prompt.Blocks, w.Prompt.Blocks) {
				t.Fatalf("replay %d request %d differs from a fresh read", i, j)
			}
		}
	}
}

// TestTraceCutIsExact: keeping only what the replay can include while a
// trace is read (traceCut) gives the very records that reading them all and
// cutting after would: rows in any order, ties, negative offsets (an Azure
// row before the first), every mix of Duration, Speed and Limit.
func TestTraceCutIsExact(t *testing.T) {
	defer func(m int) { minCompact = m }(minCompact)
	minCompact = 3 // compact often, so that compaction is checked too
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 3000 {
		n := 1 + rng.IntN(40)
		recs := make([]traceRecord, n)
		sorted := rng.IntN(2) == 0
		for i := range recs {
			at := time.Duration(rng.IntN(20)-5) * time.Second
			if sorted && i > 0 {
				at = recs[i-1].at + time.Duration(rng.IntN(3))*time.Second
			}
			recs[i] = traceRecord{at: at, input: i + 1} // input names the row
		}
		opt := TraceOptions{Speed: []float64{0, 1, 0.3, 2.5}[rng.IntN(4)]}
		if rng.IntN(3) > 0 {
			opt.Duration = time.Duration(rng.IntN(12)) * time.Second
		}
		if rng.IntN(3) > 0 {
			opt.Limit = rng.IntN(n + 2)
		}
		fromZero := rng.IntN(2) == 0
		if fromZero { // Mooncake offsets are never negative
			for i := range recs {
				recs[i].at = max(recs[i].at, 0)
			}
		}
		all := slices.Clone(recs)
		cut := traceCut{opt: opt, fromZero: fromZero}
		for _, r := range recs {
			cut.add(r)
		}
		kept := cut.recs
		if !fromZero {
			fromEarliest(all)
			fromEarliest(kept)
		}
		want := replayOf("test", all, opt)
		got, err := newTraceCut("test", &cut)
		if err != nil {
			t.Fatalf("trial %d: %v (kept %d of %d)", trial, err, len(kept), n)
		}
		if !slices.EqualFunc(got.recs, want.recs, func(a, b traceRecord) bool { return a.at == b.at && a.input == b.input }) {
			t.Fatalf("trial %d, %+v fromZero %v, rows %v:\nkept-then-cut %v\nread-all-then-cut %v", trial, opt, fromZero, recs, got.recs, want.recs)
		}
	}
}

// TestBailianCutKeepsSessions: a Bailian trace read with a cut replays
// exactly the requests, and the sessions, that the whole trace replays
// before that cut, though its rows come out of order and some parents come
// after their children or lie beyond the cut.
func TestBailianCutKeepsSessions(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 200 {
		n := 2 + rng.IntN(30)
		var b strings.Builder
		for i := range n {
			parent := -1
			switch {
			case i > 0 && rng.IntN(4) == 0:
				parent = n + 1 + rng.IntN(5) // a conversation begun before the trace
			case i > 0 && rng.IntN(3) > 0:
				parent = 1 + rng.IntN(i) // an earlier row, whose timestamp may be later
			}
			fmt.Fprintf(&b, `{"chat_id": %d, "parent_chat_id": %d, "timestamp": %d, "input_length": %d, "output_length": 1, "hash_ids": [%d]}`+"\n",
				i+1, parent, rng.IntN(60), 16+i, rng.IntN(4))
		}
		speed := []float64{1, 0.5, 2}[rng.IntN(3)]
		opt := TraceOptions{Speed: speed, Duration: time.Duration(rng.IntN(40)) * time.Second, Limit: rng.IntN(n + 1)}
		whole, err := ReadBailian(strings.NewReader(b.String()), TraceOptions{Speed: speed})
		if err != nil {
			t.Fatal(err)
		}
		var want []*Request
		for !whole.Done() {
			r := whole.Pop()
			if (opt.Duration == 0 || r.At < opt.Duration) && (opt.Limit == 0 || len(want) < opt.Limit) {
				want = append(want, r)
			}
		}
		cut, err := ReadBailian(strings.NewReader(b.String()), opt)
		if err != nil {
			t.Fatal(err)
		}
		var got []*Request
		for !cut.Done() {
			got = append(got, cut.Pop())
		}
		if !slices.EqualFunc(got, want, func(a, b *Request) bool {
			return a.At == b.At && a.Prompt.Tokens == b.Prompt.Tokens && a.Session == b.Session && a.Turn == b.Turn
		}) {
			t.Fatalf("trial %d, %+v: cut replay differs from the whole trace's before the cut\n%s", trial, opt, b.String())
		}
	}
}

// TestTraceCutBoundsRowsInAnyOrder: rows in falling time order each look
// like the earliest yet, so neither the cut's window nor its limit drops
// them as they come; compaction keeps what is held within twice the cut.
func TestTraceCutBoundsRowsInAnyOrder(t *testing.T) {
	defer func(m int) { minCompact = m }(minCompact)
	minCompact = 8
	for _, opt := range []TraceOptions{{Limit: 10}, {Duration: 5 * time.Second}, {Duration: time.Hour, Limit: 3}} {
		cut := traceCut{opt: opt}
		var all []traceRecord
		for i := range 10_000 {
			r := traceRecord{at: time.Duration(10_000-i) * time.Second, input: i + 1}
			all = append(all, r)
			cut.add(r)
			if len(cut.recs) > 2*max(opt.Limit, 6, minCompact) {
				t.Fatalf("%+v: %d records held after %d rows", opt, len(cut.recs), i+1)
			}
		}
		fromEarliest(all)
		fromEarliest(cut.recs)
		want := replayOf("test", all, opt)
		got, err := newTraceCut("test", &cut)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.EqualFunc(got.recs, want.recs, func(a, b traceRecord) bool { return a.at == b.at && a.input == b.input }) {
			t.Errorf("%+v: kept %v, want %v", opt, got.recs, want.recs)
		}
	}
}
