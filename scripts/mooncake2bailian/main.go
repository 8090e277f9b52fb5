// Command mooncake2bailian rewrites a Mooncake trace (JSONL: timestamp in
// milliseconds, input_length, output_length, hash_ids of 512-token blocks)
// in the Qwen-Bailian format, so that `llmlb bench --trace` replays it with
// session keys and the session rules of policy cost (bursts, the session
// table) act on its real arrival times. Mooncake traces carry no
// conversation ids, so the links are inferred: a request's parent is the
// earlier request, among the last -window, whose whole prompt it extends
// (every hash id of the earlier prompt, bar a partial last block, begins
// this one's) with the longest common prefix, if that is at least
// -min-blocks ids (the conversation trace starts every prompt with one
// shared system-prompt block, so 1 would link everything). A request
// without one starts a conversation. Each 512-token id becomes 32 ids of
// 16-token blocks, so cache hits stay where they were.
//
//	go run ./scripts/mooncake2bailian < traces/mooncake_conversation_head.jsonl > conv-bailian.jsonl
//	go run ./cmd/llmlb bench --trace conv-bailian.jsonl --replicas 4 --trace-speed 0.5
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"

	"github.com/llmlb/llmlb/internal/workload"
)

// mooncakeLine is the part of a Mooncake trace line that is read.
type mooncakeLine struct {
	Timestamp    float64  `json:"timestamp"`
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

// bailianLine is one line written, in the field order of the Qwen-Bailian
// traces.
type bailianLine struct {
	ChatID       int      `json:"chat_id"`
	ParentChatID int      `json:"parent_chat_id"`
	Timestamp    float64  `json:"timestamp"`
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	Type         string   `json:"type"`
	Turn         int      `json:"turn"`
	HashIDs      []uint64 `json:"hash_ids"`
}

// Block sizes of the two formats' hash ids.
const (
	mooncakeBlockTokens = 512
	bailianBlockTokens  = 16
	perMooncakeBlock    = mooncakeBlockTokens / bailianBlockTokens
)

func main() {
	window := flag.Int("window", 600, "how many earlier requests are searched for a request's parent")
	minBlocks := flag.Int("min-blocks", 3, "the fewest leading 512-token ids a request must share with its parent")
	flag.Parse()
	if *window < 1 || *minBlocks < 1 {
		fmt.Fprintln(os.Stderr, "mooncake2bailian: -window and -min-blocks must be at least 1")
		os.Exit(2)
	}
	out := bufio.NewWriter(os.Stdout)
	if err := convert(os.Stdin, out, *window, *minBlocks); err != nil {
		fmt.Fprintln(os.Stderr, "mooncake2bailian:", err)
		os.Exit(1)
	}
	if err := out.Flush(); err != nil {
		fmt.Fprintln(os.Stderr, "mooncake2bailian:", err)
		os.Exit(1)
	}
}

// convert reads a Mooncake trace from r and writes it to w in the Bailian
// format (see the package comment). It keeps only the last window requests,
// so a long trace streams through in bounded memory.
func convert(r io.Reader, w io.Writer, window, minBlocks int) error {
	var recent []earlier // the last window requests, oldest first
	first := 0           // the index of recent[0]
	dec := json.NewDecoder(r)
	enc := json.NewEncoder(w)
	for i := 0; ; i++ {
		var m mooncakeLine
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("request %d: %w", i+1, err)
		}
		ids, err := blockIDs(m)
		if err != nil {
			return fmt.Errorf("request %d: %w", i+1, err)
		}
		parent, turn := -1, 1
		if p := parentOf(recent, m.HashIDs, minBlocks); p >= 0 {
			parent, turn = first+p, recent[p].turn+1
		}
		if len(recent) == window {
			copy(recent, recent[1:])
			recent, first = recent[:window-1], first+1
		}
		recent = append(recent, earlier{ids: m.HashIDs, turn: turn})
		if err := enc.Encode(bailianLine{ChatID: i, ParentChatID: parent, Timestamp: m.Timestamp / 1000,
			InputLength: m.InputLength, OutputLength: m.OutputLength, Type: "text", Turn: turn, HashIDs: ids}); err != nil {
			return err
		}
	}
}

// earlier is what parentOf needs of a request already written.
type earlier struct {
	ids  []uint64 // its 512-token hash ids
	turn int
}

// parentOf returns the index of the request in recent whose prompt ids,
// bar the last, begin ids, sharing the most and at least minBlocks with it
// (the latest of equals), or -1.
func parentOf(recent []earlier, ids []uint64, minBlocks int) int {
	best, bestShared := -1, minBlocks-1
	for j := len(recent) - 1; j >= 0; j-- {
		prev := recent[j].ids
		shared := 0
		for shared < min(len(prev), len(ids)) && prev[shared] == ids[shared] {
			shared++
		}
		if shared > bestShared && shared >= len(prev)-1 {
			best, bestShared = j, shared
		}
	}
	return best
}

// blockIDs maps a Mooncake request's 512-token ids onto one id per 16-token
// block of its prompt.
func blockIDs(m mooncakeLine) ([]uint64, error) {
	if m.InputLength < 1 || m.InputLength > workload.MaxTraceTokens || m.OutputLength < 0 || math.IsNaN(m.Timestamp) || m.Timestamp < 0 {
		return nil, fmt.Errorf("want input_length 1..%d, output_length >= 0 and a timestamp >= 0, got %d, %d, %v",
			workload.MaxTraceTokens, m.InputLength, m.OutputLength, m.Timestamp)
	}
	n := (m.InputLength + bailianBlockTokens - 1) / bailianBlockTokens
	if need := (n + perMooncakeBlock - 1) / perMooncakeBlock; len(m.HashIDs) < need {
		return nil, fmt.Errorf("%d hash_ids for %d tokens, want %d", len(m.HashIDs), m.InputLength, need)
	}
	ids := make([]uint64, n)
	for b := range ids {
		h := m.HashIDs[b/perMooncakeBlock]
		if h > math.MaxUint64/perMooncakeBlock {
			return nil, fmt.Errorf("hash id %d too large", h)
		}
		ids[b] = h*perMooncakeBlock + uint64(b%perMooncakeBlock)
	}
	return ids, nil
}
