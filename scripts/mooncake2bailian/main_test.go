package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/llmlb/llmlb/internal/workload"
)

// A conversation of three turns (each extends the one before), an unrelated
// request sharing only the first block, and a fourth turn beyond the window.
const trace = `{"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [1, 2]}
{"timestamp": 500, "input_length": 700, "output_length": 5, "hash_ids": [1, 9]}
{"timestamp": 1500, "input_length": 1600, "output_length": 20, "hash_ids": [1, 2, 3, 4]}
{"timestamp": 2500, "input_length": 2100, "output_length": 30, "hash_ids": [1, 2, 3, 4, 5]}
`

// converted runs convert on text and decodes the lines it writes.
func converted(t *testing.T, text string, window, minBlocks int) []bailianLine {
	t.Helper()
	var out bytes.Buffer
	if err := convert(strings.NewReader(text), &out, window, minBlocks); err != nil {
		t.Fatal(err)
	}
	var lines []bailianLine
	dec := json.NewDecoder(&out)
	for dec.More() {
		var l bailianLine
		if err := dec.Decode(&l); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, l)
	}
	return lines
}

func TestConvertLinksTurns(t *testing.T) {
	got := converted(t, trace, 600, 2)
	type link struct{ Chat, Parent, Turn int }
	var links []link
	for _, l := range got {
		links = append(links, link{l.ChatID, l.ParentChatID, l.Turn})
	}
	want := []link{{0, -1, 1}, {1, -1, 1}, {2, 0, 2}, {3, 2, 3}}
	if diff := cmp.Diff(want, links); diff != "" {
		t.Errorf("links (-want +got):\n%s", diff)
	}
	// One id per 16-token block; the 512-token id 2 is ids 64..95.
	if n := len(got[0].HashIDs); n != 63 { // ceil(1000/16)
		t.Fatalf("%d ids for 1000 tokens, want 63", n)
	}
	if got[0].HashIDs[0] != 32 || got[0].HashIDs[31] != 63 || got[0].HashIDs[32] != 64 || got[1].HashIDs[32] != 9*32 {
		t.Errorf("ids %v", got[0].HashIDs[:33])
	}
	if got[2].Timestamp != 1.5 {
		t.Errorf("timestamp %v s, want 1.5 (milliseconds to seconds)", got[2].Timestamp)
	}

	// The bench reads the result with a session per conversation.
	var out bytes.Buffer
	if err := convert(strings.NewReader(trace), &out, 600, 2); err != nil {
		t.Fatal(err)
	}
	w, err := workload.ReadBailian(&out, workload.TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sessions := map[string][]int{}
	for !w.Done() {
		r := w.Pop()
		sessions[r.Profile.SessionKey] = append(sessions[r.Profile.SessionKey], r.Prompt.Tokens)
	}
	if len(sessions) != 2 {
		t.Errorf("sessions %v, want two: the conversation and the unrelated request", sessions)
	}
}

func TestConvertMinBlocksAndWindow(t *testing.T) {
	parents := func(window, minBlocks int) []int {
		var ps []int
		for _, l := range converted(t, trace, window, minBlocks) {
			ps = append(ps, l.ParentChatID)
		}
		return ps
	}
	// Sharing one block is not a conversation unless min-blocks allows it:
	// then the unrelated request links to the first.
	if diff := cmp.Diff([]int{-1, 0, 0, 2}, parents(600, 1)); diff != "" {
		t.Errorf("min-blocks 1 (-want +got):\n%s", diff)
	}
	// A request that branches off a longer prompt (shares its first ids but
	// does not extend it) is not its next turn; it extends the shorter one.
	var out bytes.Buffer
	branch := trace + `{"timestamp": 3000, "input_length": 1500, "output_length": 1, "hash_ids": [1, 2, 7]}` + "\n"
	if err := convert(strings.NewReader(branch), &out, 600, 2); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if last := lines[len(lines)-1]; !strings.Contains(last, `"parent_chat_id":0,`) {
		t.Errorf("branch: %s, want parent 0", last)
	}
	// A window of one sees only the request just before.
	if diff := cmp.Diff([]int{-1, -1, -1, 2}, parents(1, 2)); diff != "" {
		t.Errorf("window 1 (-want +got):\n%s", diff)
	}
}

func TestConvertRejectsBadLines(t *testing.T) {
	for _, line := range []string{
		`{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}`,
		`{"timestamp": 0, "input_length": 1100, "output_length": 1, "hash_ids": [1, 2]}`,
		`{"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [1]}`,
		`{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [18446744073709551615]}`,
		`{"timestamp": 0, "input_length": 10000001, "output_length": 1, "hash_ids": [1]}`,
		`not json`,
	} {
		var out bytes.Buffer
		if err := convert(strings.NewReader(line), &out, 600, 3); err == nil || !strings.HasPrefix(err.Error(), "request 1: ") {
			t.Errorf("%s: error %v, want one naming request 1", line, err)
		}
	}
}
