package workload

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/llmlb/llmlb/internal/request"
	"github.com/llmlb/llmlb/internal/tokenize"
)

// TraceOptions shapes a trace replay.
type TraceOptions struct {
	// Duration cuts the replay off: requests arriving at or after it (after
	// Speed is applied) are dropped. 0 replays the whole trace.
	Duration time.Duration
	// Speed compresses time: arrival offsets are divided by it, so 2 replays
	// twice as fast (twice the load). 0 means 1.
	Speed float64
	// Limit keeps only the first Limit requests; 0 keeps all.
	Limit int
}

// MooncakeBlockTokens is the size of the blocks a Mooncake trace's hash_ids
// name; each maps onto 32 of the engine's 16-token blocks.
const MooncakeBlockTokens = 512

// BailianBlockTokens is the size of the blocks a Bailian (Qwen) trace's
// hash_ids name: the engine's own block size.
const BailianBlockTokens = 16

// bailianPrefixTokens is how much of a Bailian prompt its prefix key covers:
// the profiler hashes the first 4,096 characters, about 1,024 tokens.
const bailianPrefixTokens = 1024

// maxTraceTokens bounds a trace request's prompt and output, so that a
// corrupt line is an error rather than an allocation that kills the process.
const maxTraceTokens = 10_000_000

// maxTraceMillis bounds a Mooncake timestamp (about 30 years) so that the
// offset fits a time.Duration.
const maxTraceMillis = 1e12

// ErrUnknownFormat is returned by OpenTrace for a format it cannot read.
var ErrUnknownFormat = errors.New("workload: unknown trace format")

// TraceFormats lists the formats OpenTrace reads.
var TraceFormats = []string{"mooncake", "bailian", "azure"}

// OpenTrace reads the trace file at path. format is "mooncake", "bailian" or
// "azure"; "" takes it from the file: .csv is azure, and a .jsonl file is
// bailian when its first line has a "chat_id" field, else mooncake.
func OpenTrace(path, format string, opt TraceOptions) (Workload, error) {
	sniff := false // a .jsonl file: mooncake or bailian, the first line tells
	if format == "" {
		switch strings.ToLower(filepath.Ext(path)) {
		case ".jsonl":
			format, sniff = "mooncake", true
		case ".csv":
			format = "azure"
		default:
			return nil, fmt.Errorf("%w: cannot tell the format of %s from its extension (want .jsonl or .csv, or name the format)", ErrUnknownFormat, path)
		}
	}
	if !slices.Contains(TraceFormats, format) {
		return nil, fmt.Errorf("%w %q (known: %s)", ErrUnknownFormat, format, strings.Join(TraceFormats, ", "))
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("workload: open trace: %w", err)
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 1<<16)
	if sniff {
		format = sniffJSONL(br)
	}
	read := ReadMooncake
	switch format {
	case "bailian":
		read = ReadBailian
	case "azure":
		read = ReadAzure
	}
	w, err := read(br, opt)
	if err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, path)
	}
	return w, nil
}

// sniffJSONL tells a Bailian trace from a Mooncake one by its first line's
// fields: Bailian's records begin with chat_id and parent_chat_id, which
// Mooncake's lack. Only the first 64 KiB are looked at (a Bailian line's
// chat_id comes before its hash_ids).
func sniffJSONL(br *bufio.Reader) string {
	buf, _ := br.Peek(1 << 16)
	for len(buf) > 0 {
		line, rest, _ := bytes.Cut(buf, []byte("\n"))
		if len(bytes.TrimSpace(line)) > 0 {
			if bytes.Contains(line, []byte(`"chat_id"`)) {
				return "bailian"
			}
			break
		}
		buf = rest
	}
	return "mooncake"
}

// traceRecord is one request of a trace, before its prompt is built.
type traceRecord struct {
	at      time.Duration // offset from the trace's first request, before Speed
	input   int
	output  int
	ids     []uint64 // Mooncake or Bailian hash_ids; nil for Azure
	session string   // Bailian: the conversation (its first request's chat_id)
	turn    int      // Bailian: the turn within it
}

// mooncakeLine is one line of a Mooncake trace.
type mooncakeLine struct {
	Timestamp    *float64 `json:"timestamp"`
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

// eachJSONLine decodes every non-blank line of a JSONL trace into a fresh T
// and hands it to fn with its 1-based line number; it stops at the first
// error (a line that is not JSON, one fn refuses, or a read error), named by
// the format.
func eachJSONLine[T any](format string, r io.Reader, fn func(line int, m *T) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<16), 64<<20)
	for line := 1; sc.Scan(); line++ {
		b := sc.Bytes()
		if len(bytes.TrimSpace(b)) == 0 {
			continue
		}
		var m T
		if err := json.Unmarshal(b, &m); err != nil {
			return fmt.Errorf("workload: %s line %d: %w", format, line, err)
		}
		if err := fn(line, &m); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("workload: %s: %w", format, err)
	}
	return nil
}

// checkLengths bounds a trace request's prompt and output tokens.
func checkLengths(format string, line, input, output int) error {
	switch {
	case input < 1 || input > maxTraceTokens:
		return fmt.Errorf("workload: %s line %d: input_length %d, want 1..%d", format, line, input, maxTraceTokens)
	case output < 0 || output > maxTraceTokens:
		return fmt.Errorf("workload: %s line %d: output_length %d, want 0..%d", format, line, output, maxTraceTokens)
	}
	return nil
}

// ReadMooncake reads a Mooncake trace (JSONL: timestamp in ms,
// input_length, output_length, hash_ids of 512-token blocks). Full 512-token
// blocks map onto 32 engine blocks keyed by their hash id, so equal ids give
// a cache hit; a partial last block shares nothing. Requests carry no
// session key (the trace has none) and a prefix key derived from the first
// two hash ids (docs/WORKLOADS.md).
func ReadMooncake(r io.Reader, opt TraceOptions) (Workload, error) {
	if err := opt.validate(); err != nil {
		return nil, err
	}
	var recs []traceRecord
	err := eachJSONLine("mooncake", r, func(line int, m *mooncakeLine) error {
		switch {
		case m.Timestamp == nil || m.InputLength == nil || m.OutputLength == nil:
			return fmt.Errorf("workload: mooncake line %d: timestamp, input_length and output_length are required", line)
		case math.IsNaN(*m.Timestamp) || *m.Timestamp < 0 || *m.Timestamp > maxTraceMillis:
			return fmt.Errorf("workload: mooncake line %d: bad timestamp %v (want 0..%g ms)", line, *m.Timestamp, maxTraceMillis)
		}
		if err := checkLengths("mooncake", line, *m.InputLength, *m.OutputLength); err != nil {
			return err
		}
		recs = append(recs, traceRecord{
			at:     time.Duration(*m.Timestamp * float64(time.Millisecond)),
			input:  *m.InputLength,
			output: *m.OutputLength,
			ids:    m.HashIDs,
		})
		return nil
	})
	if err != nil {
		return nil, err
	}
	return unwrap(newTrace("mooncake", recs, opt))
}

// azureLayout is the Azure trace's TIMESTAMP format; fractional seconds of
// any length are accepted when parsing.
const azureLayout = "2006-01-02 15:04:05"

// ReadAzure reads an Azure LLM inference trace (CSV with a header naming
// TIMESTAMP, ContextTokens and GeneratedTokens). Arrivals are offsets from
// the earliest timestamp; prompts share nothing (the trace has no content).
func ReadAzure(r io.Reader, opt TraceOptions) (Workload, error) {
	if err := opt.validate(); err != nil {
		return nil, err
	}
	cr := csv.NewReader(r)
	cr.ReuseRecord = true
	cr.FieldsPerRecord = -1
	head, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("workload: azure: reading the header: %w", err)
	}
	col := map[string]int{"timestamp": -1, "contexttokens": -1, "generatedtokens": -1}
	for i, h := range head {
		k := strings.ToLower(strings.TrimSpace(strings.TrimPrefix(h, "\ufeff")))
		if _, ok := col[k]; ok {
			col[k] = i
		}
	}
	for _, k := range []string{"timestamp", "contexttokens", "generatedtokens"} {
		if col[k] < 0 {
			return nil, fmt.Errorf("workload: azure: header %q lacks a %s column (want TIMESTAMP,ContextTokens,GeneratedTokens)", strings.Join(head, ","), k)
		}
	}
	need := max(col["timestamp"], col["contexttokens"], col["generatedtokens"])
	var recs []traceRecord
	var stamps []time.Time
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("workload: azure: %w", err)
		}
		line, _ := cr.FieldPos(0)
		if len(rec) <= need {
			return nil, fmt.Errorf("workload: azure line %d: %d fields, want at least %d", line, len(rec), need+1)
		}
		ts, err := parseAzureTime(strings.TrimSpace(rec[col["timestamp"]]))
		if err != nil {
			return nil, fmt.Errorf("workload: azure line %d: %w", line, err)
		}
		in, err1 := strconv.Atoi(strings.TrimSpace(rec[col["contexttokens"]]))
		out, err2 := strconv.Atoi(strings.TrimSpace(rec[col["generatedtokens"]]))
		switch {
		case err1 != nil || in < 1 || in > maxTraceTokens:
			return nil, fmt.Errorf("workload: azure line %d: ContextTokens %q, want an integer 1..%d", line, rec[col["contexttokens"]], maxTraceTokens)
		case err2 != nil || out < 0 || out > maxTraceTokens:
			return nil, fmt.Errorf("workload: azure line %d: GeneratedTokens %q, want an integer 0..%d", line, rec[col["generatedtokens"]], maxTraceTokens)
		}
		stamps = append(stamps, ts)
		recs = append(recs, traceRecord{input: in, output: out})
	}
	if len(stamps) > 0 {
		first := slices.MinFunc(stamps, func(a, b time.Time) int { return a.Compare(b) })
		for i := range recs {
			recs[i].at = stamps[i].Sub(first)
		}
	}
	return unwrap(newTrace("azure", recs, opt))
}

// bailianLine is one line of a Bailian (Alibaba Qwen serving) trace.
type bailianLine struct {
	ChatID       *int64   `json:"chat_id"`
	ParentChatID *int64   `json:"parent_chat_id"`
	Timestamp    *float64 `json:"timestamp"`
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	Turn         int      `json:"turn"`
	HashIDs      []uint64 `json:"hash_ids"`
}

// ReadBailian reads a trace in the format of Alibaba's Qwen-Bailian usage
// traces (github.com/alibaba-edu/qwen-bailian-usagetraces-anon; JSONL:
// chat_id, parent_chat_id (-1 for a conversation's first request),
// timestamp in seconds, input_length, output_length, type, turn, hash_ids of
// 16-token blocks). Arrivals are offsets from the earliest timestamp. Each
// hash id is one engine block, chained like the engine's, so a cache hit
// needs the whole prefix of ids to be equal; a partial last block shares
// nothing. A request's session key names its
// conversation, found by following parent_chat_id to the first request; its
// prefix key stands for the first 1,024 tokens (docs/WORKLOADS.md).
func ReadBailian(r io.Reader, opt TraceOptions) (Workload, error) {
	if err := opt.validate(); err != nil {
		return nil, err
	}
	var recs []traceRecord
	var chats, parents []int64 // per record; parents[i] < 0: a first request
	err := eachJSONLine("bailian", r, func(line int, m *bailianLine) error {
		switch {
		case m.ChatID == nil || m.Timestamp == nil || m.InputLength == nil || m.OutputLength == nil:
			return fmt.Errorf("workload: bailian line %d: chat_id, timestamp, input_length and output_length are required", line)
		case math.IsNaN(*m.Timestamp) || *m.Timestamp < 0 || *m.Timestamp > maxTraceMillis/1000:
			return fmt.Errorf("workload: bailian line %d: bad timestamp %v (want 0..%g s)", line, *m.Timestamp, maxTraceMillis/1000)
		}
		if err := checkLengths("bailian", line, *m.InputLength, *m.OutputLength); err != nil {
			return err
		}
		parent := int64(-1)
		if m.ParentChatID != nil {
			parent = *m.ParentChatID
		}
		chats, parents = append(chats, *m.ChatID), append(parents, parent)
		recs = append(recs, traceRecord{
			at:     time.Duration(*m.Timestamp * float64(time.Second)),
			input:  *m.InputLength,
			output: *m.OutputLength,
			ids:    m.HashIDs,
			turn:   max(m.Turn, 1),
		})
		return nil
	})
	if err != nil {
		return nil, err
	}
	roots, err := bailianRoots(chats, parents)
	if err != nil {
		return nil, err
	}
	first := time.Duration(math.MaxInt64)
	for i := range recs {
		first = min(first, recs[i].at)
	}
	for i := range recs {
		recs[i].session = "bailian-chat-" + strconv.FormatInt(roots[i], 10)
		recs[i].at -= first
	}
	return unwrap(newTrace("bailian", recs, opt))
}

// bailianRoots returns each record's conversation: the chat_id reached by
// following parent_chat_id until a negative one or one the trace lacks (a
// conversation that began before the trace did).
func bailianRoots(chats, parents []int64) ([]int64, error) {
	parentOf := make(map[int64]int64, len(chats))
	for i, c := range chats {
		parentOf[c] = parents[i]
	}
	rootOf := make(map[int64]int64, len(chats))
	roots := make([]int64, len(chats))
	var path []int64
	for i, c := range chats {
		path = path[:0]
		root := c
		for {
			if r, ok := rootOf[root]; ok {
				root = r
				break
			}
			p, ok := parentOf[root]
			if !ok || p < 0 {
				break
			}
			if path = append(path, root); len(path) > len(chats) {
				return nil, fmt.Errorf("workload: bailian: the parent_chat_id chain from chat_id %d loops", c)
			}
			root = p
		}
		for _, v := range path {
			rootOf[v] = root
		}
		rootOf[c] = root
		roots[i] = root
	}
	return roots, nil
}

// parseAzureTime reads "2023-11-16 18:17:03.9799600" (or seconds as a number).
func parseAzureTime(s string) (time.Time, error) {
	if t, err := time.Parse(azureLayout, s); err == nil {
		return t, nil
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil && f >= 0 && f <= maxTraceMillis/1000 {
		return time.Unix(0, 0).Add(time.Duration(f * float64(time.Second))), nil
	}
	return time.Time{}, fmt.Errorf("bad TIMESTAMP %q (want %q or seconds)", s, azureLayout)
}

func (o TraceOptions) validate() error {
	switch {
	case o.Duration < 0:
		return fmt.Errorf("workload: trace: negative duration %v", o.Duration)
	case math.IsNaN(o.Speed) || math.IsInf(o.Speed, 0) || o.Speed < 0:
		return fmt.Errorf("workload: trace: speed must be a finite number > 0, got %v", o.Speed)
	case o.Limit < 0:
		return fmt.Errorf("workload: trace: negative limit %d", o.Limit)
	}
	return nil
}

// traceGen replays trace records in arrival order; it is open-loop.
type traceGen struct {
	format   string
	recs     []traceRecord
	i        int
	speed    float64
	ids      ids
	keys     []uint64             // scratch: one prompt's block keys (FromBlockKeys copies them)
	prefixes map[[2]uint64]string // Mooncake prefix keys by their first two ids
}

func newTrace(format string, recs []traceRecord, opt TraceOptions) (*traceGen, error) {
	if len(recs) == 0 {
		return nil, fmt.Errorf("workload: %s: the trace holds no requests", format)
	}
	speed := opt.Speed
	if speed == 0 {
		speed = 1
	}
	slices.SortStableFunc(recs, func(a, b traceRecord) int { return cmp.Compare(a.at, b.at) })
	for i := range recs {
		recs[i].at = time.Duration(float64(recs[i].at) / speed)
	}
	if opt.Duration > 0 {
		n, _ := slices.BinarySearchFunc(recs, opt.Duration, func(r traceRecord, d time.Duration) int { return cmp.Compare(r.at, d) })
		recs = recs[:n]
	}
	if opt.Limit > 0 && len(recs) > opt.Limit {
		recs = recs[:opt.Limit]
	}
	return &traceGen{format: format, recs: recs, speed: speed, prefixes: map[[2]uint64]string{}}, nil
}

// Peek implements Workload.
func (g *traceGen) Peek() (time.Duration, bool) {
	if g.i >= len(g.recs) {
		return 0, false
	}
	return g.recs[g.i].at, true
}

// Pop implements Workload.
func (g *traceGen) Pop() *Request {
	if g.i >= len(g.recs) {
		return nil
	}
	rec := &g.recs[g.i]
	g.i++
	r := &Request{ID: g.ids.take(), At: rec.at, Turn: 1, Output: max(rec.output, 1), owner: g}
	own := contentID(0, domTraceRequest, r.ID)
	var prefixKey string
	switch g.format {
	case "mooncake":
		r.Prompt = g.idPrompt(rec, own, MooncakeBlockTokens, domMooncake)
		prefixKey = g.mooncakePrefix(rec, r.ID)
	case "bailian":
		r.Prompt = g.idPrompt(rec, own, BailianBlockTokens, domBailian)
		prefixKey = bailianPrefix(rec, r.Prompt, r.ID)
		r.Session, r.Turn = rec.session, rec.turn
	default:
		r.Prompt = extendPrompt(rec.input, nil, own)
	}
	r.Profile = request.Profile{
		SessionKey:   r.Session,
		PrefixKey:    prefixKey,
		PromptTokens: r.Prompt.Tokens,
		OutputTokens: DeclaredOutput,
		PromptBlocks: r.Prompt.Blocks,
	}
	// The record's ids are no longer needed once the prompt exists.
	rec.ids = nil
	return r
}

// idPrompt maps each full block of blockTokens named by a hash id onto
// blockTokens/16 engine blocks keyed mix(hash_id, k) (Mooncake: 32; Bailian:
// 1); blocks of a partial last block, or without an id, are unique to the
// request.
func (g *traceGen) idPrompt(rec *traceRecord, own uint64, blockTokens int, domain uint64) tokenize.Prompt {
	per := blockTokens / tokenize.BlockSize
	full := min(rec.input/blockTokens, len(rec.ids))
	n := rec.input / tokenize.BlockSize
	keys := g.keys[:0]
	for m := range full {
		id := contentID(0, domain, rec.ids[m])
		for k := range per {
			keys = append(keys, blockKey(id, k))
		}
	}
	for j := len(keys); j < n; j++ {
		keys = append(keys, blockKey(own, j))
	}
	g.keys = keys
	return tokenize.FromBlockKeys(rec.input, keys)
}

// mooncakePrefix stands in for the MD5 of the first 4096 characters (~1024
// tokens): the first two 512-token blocks' ids, or as many full blocks as
// the prompt has. A prompt shorter than one full block gets a key of its own.
func (g *traceGen) mooncakePrefix(rec *traceRecord, id uint64) string {
	full := min(rec.input/MooncakeBlockTokens, len(rec.ids), 2)
	if full == 0 {
		return md5Key("", "mooncake request "+strconv.FormatUint(id, 10))
	}
	k := [2]uint64{rec.ids[0], math.MaxUint64}
	if full == 2 {
		k[1] = rec.ids[1]
	}
	if s, ok := g.prefixes[k]; ok {
		return s
	}
	s := md5Key("", fmt.Sprintf("mooncake prefix %d %d", k[0], k[1]))
	g.prefixes[k] = s
	return s
}

// bailianPrefix stands in for the MD5 of the first 4096 characters: the
// chained hash of the engine block at 1,024 tokens, or of the last block the
// trace names when the prompt is shorter. A prompt without a named full block
// gets a key of its own.
func bailianPrefix(rec *traceRecord, p tokenize.Prompt, id uint64) string {
	n := min(bailianPrefixTokens/tokenize.BlockSize, rec.input/BailianBlockTokens, len(rec.ids), len(p.Blocks))
	if n == 0 {
		return md5Key("", "bailian request "+strconv.FormatUint(id, 10))
	}
	return md5Key("", "bailian prefix "+strconv.FormatUint(p.Blocks[n-1], 16))
}

// Complete implements Workload; a replay's arrivals do not depend on it.
func (g *traceGen) Complete(r *Request, at time.Duration) {
	if r != nil && r.owner == completer(g) {
		g.complete(r, at)
	}
}

func (g *traceGen) complete(r *Request, _ time.Duration) { r.done = true }

// Done implements Workload.
func (g *traceGen) Done() bool { return g.i >= len(g.recs) }
