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

// MaxTraceTokens is maxTraceTokens for tools that write traces (a longer
// request would be refused when replayed).
const MaxTraceTokens = maxTraceTokens

// maxTraceMillis bounds a Mooncake timestamp (about 30 years) so that the
// offset fits a time.Duration.
const maxTraceMillis = 1e12

// ErrUnknownFormat is returned by OpenTrace for a format it cannot read.
var ErrUnknownFormat = errors.New("workload: unknown trace format")

// TraceFormats lists the formats OpenTrace reads.
var TraceFormats = []string{"mooncake", "bailian", "azure", "burstgpt"}

// OpenTrace reads the trace file at path. format is "mooncake", "bailian",
// "azure" or "burstgpt"; "" takes it from the file: a .csv file is burstgpt
// when its header has a "Request tokens" column, else azure, and a .jsonl
// file is bailian when its first line has a "chat_id" field, else mooncake.
func OpenTrace(path, format string, opt TraceOptions) (Workload, error) {
	var sniff func(*bufio.Reader) string // the extension leaves two formats; the first line tells
	if format == "" {
		switch strings.ToLower(filepath.Ext(path)) {
		case ".jsonl":
			format, sniff = "mooncake", sniffJSONL
		case ".csv":
			format, sniff = "azure", sniffCSV
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
	if sniff != nil {
		format = sniff(br)
	}
	read := ReadMooncake
	switch format {
	case "bailian":
		read = ReadBailian
	case "azure":
		read = ReadAzure
	case "burstgpt":
		read = ReadBurstGPT
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

// sniffCSV tells a BurstGPT trace from an Azure one by its header: BurstGPT's
// names a "Request tokens" column, Azure's has ContextTokens instead. Only
// the first 64 KiB are looked at; a header that does not parse is Azure's,
// whose reader then says what is wrong with it.
func sniffCSV(br *bufio.Reader) string {
	buf, _ := br.Peek(1 << 16)
	buf = bytes.TrimPrefix(buf, []byte(utf8BOM))
	head, err := csv.NewReader(bytes.NewReader(buf)).Read()
	if err == nil && csvColumn(head, "Request tokens") >= 0 {
		return "burstgpt"
	}
	return "azure"
}

// traceRecord is one request of a trace, before its prompt is built.
type traceRecord struct {
	at      time.Duration // offset from the trace's first request, before Speed
	input   int
	output  int
	ids     []uint64 // Mooncake or Bailian hash_ids; nil for Azure and BurstGPT
	session string   // Bailian: the conversation (its first request's chat_id)
	turn    int      // Bailian: the turn within it
	row     int      // the record's 0-based row in the file (traceCut)
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
	cut := traceCut{opt: opt, fromZero: true}
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
		cut.add(traceRecord{
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
	return unwrap(newTraceCut("mooncake", &cut))
}

// eachCSVRow reads a CSV trace and hands fn the values of the columns cols
// (trimmed, in the order of cols) of every row after the header, with the
// row's 1-based line number; it stops at the first error (a header without
// one of cols, a row too short or not CSV, one fn refuses), named by the
// format. header is the format's own header, for that error. The columns
// are found by name (csvColumn), so they may come in any order among
// others. A leading UTF-8 BOM, which spreadsheet tools write, is dropped:
// it would stick to the first name, or make a quoted one a CSV error.
func eachCSVRow(format, header string, cols []string, r io.Reader, fn func(line int, v []string) error) error {
	br := bufio.NewReader(r) // r itself when OpenTrace passes its reader
	if b, _ := br.Peek(len(utf8BOM)); string(b) == utf8BOM {
		br.Discard(len(utf8BOM))
	}
	cr := csv.NewReader(br)
	cr.ReuseRecord = true
	cr.FieldsPerRecord = -1
	head, err := cr.Read()
	if err != nil {
		return fmt.Errorf("workload: %s: reading the header: %w", format, err)
	}
	at := make([]int, len(cols))
	for j, name := range cols {
		if at[j] = csvColumn(head, name); at[j] < 0 {
			return fmt.Errorf("workload: %s: header %q lacks a %s column (want %s)", format, strings.Join(head, ","), name, header)
		}
	}
	need := slices.Max(at)
	v := make([]string, len(cols))
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("workload: %s: %w", format, err)
		}
		line, _ := cr.FieldPos(0)
		if len(rec) <= need {
			return fmt.Errorf("workload: %s line %d: %d fields, want at least %d", format, line, len(rec), need+1)
		}
		for j, i := range at {
			v[j] = strings.TrimSpace(rec[i])
		}
		if err := fn(line, v); err != nil {
			return err
		}
	}
}

// utf8BOM is the byte order mark some tools put at the start of a CSV file.
const utf8BOM = "\ufeff"

// csvColumn returns the index of the header column called name
// (case-insensitive, spaces around it ignored), or -1.
func csvColumn(head []string, name string) int {
	return slices.IndexFunc(head, func(h string) bool { return strings.EqualFold(strings.TrimSpace(h), name) })
}

// azureHeader is the Azure traces' header (2023 and 2024 alike).
const azureHeader = "TIMESTAMP,ContextTokens,GeneratedTokens"

// ReadAzure reads an Azure LLM inference trace, 2023 or 2024 (CSV with a
// header naming TIMESTAMP, ContextTokens and GeneratedTokens). Arrivals are
// offsets from the earliest timestamp; prompts share nothing (the trace has
// no content).
func ReadAzure(r io.Reader, opt TraceOptions) (Workload, error) {
	if err := opt.validate(); err != nil {
		return nil, err
	}
	cut := traceCut{opt: opt}
	var ref time.Time // the first row's time: offsets are kept from it until the earliest is known
	haveRef := false
	err := eachCSVRow("azure", azureHeader, strings.Split(azureHeader, ","), r, func(line int, v []string) error {
		ts, err := parseAzureTime(v[0])
		if err != nil {
			return fmt.Errorf("workload: azure line %d: %w", line, err)
		}
		in, err1 := strconv.Atoi(v[1])
		out, err2 := strconv.Atoi(v[2])
		switch {
		case err1 != nil || in < 1 || in > maxTraceTokens:
			return fmt.Errorf("workload: azure line %d: ContextTokens %q, want an integer 1..%d", line, v[1], maxTraceTokens)
		case err2 != nil || out < 0 || out > maxTraceTokens:
			return fmt.Errorf("workload: azure line %d: GeneratedTokens %q, want an integer 0..%d", line, v[2], maxTraceTokens)
		}
		if !haveRef {
			ref, haveRef = ts, true
		}
		// Rows within maxTraceMillis of the first are within twice that of
		// each other: offsets that time.Duration holds.
		at := ts.Sub(ref)
		if at > maxTraceMillis*time.Millisecond || at < -maxTraceMillis*time.Millisecond {
			return fmt.Errorf("workload: azure line %d: TIMESTAMP %q is more than %v from the first row's", line, v[0], time.Duration(maxTraceMillis*time.Millisecond))
		}
		cut.add(traceRecord{at: at, input: in, output: out})
		return nil
	})
	if err != nil {
		return nil, err
	}
	fromEarliest(cut.recs)
	return unwrap(newTraceCut("azure", &cut))
}

// parseAzureTime reads an Azure TIMESTAMP: a date and a time of day with any
// fraction of a second, "2023-11-16 18:17:03.9799600" (2023, UTC) or
// "2024-05-10 00:00:00.009930+00:00" (2024, with its UTC offset), a T in
// place of the space and a Z for the offset (as some tools re-export it);
// or seconds as a number. Times are absolute, so rows with different
// offsets are the right distance apart.
func parseAzureTime(s string) (time.Time, error) {
	layout := "2006-01-02 15:04:05"
	if len(s) > len("2006-01-02") && s[len("2006-01-02")] == 'T' {
		layout = "2006-01-02T15:04:05"
	}
	// A zone follows the time: Z, or a sign after the date's own dashes.
	if strings.HasSuffix(s, "Z") || strings.LastIndexAny(s, "+-") > len("2006-01-02") {
		layout += "Z07:00"
	}
	if t, err := time.Parse(layout, s); err == nil {
		return t, nil
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil && f >= 0 && f <= maxTraceMillis/1000 {
		return time.Unix(0, 0).Add(time.Duration(f * float64(time.Second))), nil
	}
	return time.Time{}, fmt.Errorf(`bad TIMESTAMP %q (want "2006-01-02 15:04:05" with an optional fraction of a second, a T or a space after the date, an optional zone Z or +hh:mm or -hh:mm; or seconds 0..%g)`, s, maxTraceMillis/1000)
}

// burstGPTHeader is the BurstGPT traces' header.
const burstGPTHeader = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"

// ReadBurstGPT reads a BurstGPT trace (github.com/HPMLL/BurstGPT, arXiv
// 2401.17644: ChatGPT and GPT-4 requests served on Azure; CSV with a header
// naming Timestamp, in seconds from the trace's start, Request tokens and
// Response tokens). Arrivals are offsets from the earliest timestamp;
// prompts share nothing (the trace has no content or sessions). Model and
// Log Type are ignored: one fleet serves every row. A failed request
// (Response tokens 0) is replayed like any other; a row with 0 Request
// tokens has no prompt to send and is skipped (docs/WORKLOADS.md).
func ReadBurstGPT(r io.Reader, opt TraceOptions) (Workload, error) {
	if err := opt.validate(); err != nil {
		return nil, err
	}
	cut := traceCut{opt: opt}
	skipped := 0
	cols := []string{"Timestamp", "Request tokens", "Response tokens"}
	err := eachCSVRow("burstgpt", burstGPTHeader, cols, r, func(line int, v []string) error {
		ts, err := strconv.ParseFloat(v[0], 64)
		in, err1 := strconv.Atoi(v[1])
		out, err2 := strconv.Atoi(v[2])
		switch {
		case err != nil || !(ts >= 0 && ts <= maxTraceMillis/1000): // NaN fails both
			return fmt.Errorf("workload: burstgpt line %d: Timestamp %q, want seconds 0..%g", line, v[0], maxTraceMillis/1000)
		case err1 != nil || in < 0 || in > maxTraceTokens:
			return fmt.Errorf("workload: burstgpt line %d: Request tokens %q, want an integer 1..%d (0 skips the row)", line, v[1], maxTraceTokens)
		case err2 != nil || out < 0 || out > maxTraceTokens:
			return fmt.Errorf("workload: burstgpt line %d: Response tokens %q, want an integer 0..%d", line, v[2], maxTraceTokens)
		case in == 0:
			skipped++
			return nil
		}
		cut.add(traceRecord{at: time.Duration(ts * float64(time.Second)), input: in, output: out})
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(cut.recs) == 0 && skipped > 0 {
		return nil, fmt.Errorf("workload: burstgpt: the trace holds no requests (every row has 0 Request tokens: %d skipped)", skipped)
	}
	fromEarliest(cut.recs)
	g, err := newTraceCut("burstgpt", &cut)
	if err != nil {
		return nil, err
	}
	g.skipped = skipped
	return g, nil
}

// fromEarliest makes the records' arrivals offsets from the earliest one.
func fromEarliest(recs []traceRecord) {
	if len(recs) == 0 {
		return
	}
	first := slices.MinFunc(recs, func(a, b traceRecord) int { return cmp.Compare(a.at, b.at) }).at
	for i := range recs {
		recs[i].at -= first
	}
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
	cut := traceCut{opt: opt}
	var chats, parents []int64 // per row, kept or not; parents[i] < 0: a first request
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
		cut.add(traceRecord{
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
	for i := range cut.recs {
		cut.recs[i].session = "bailian-chat-" + strconv.FormatInt(roots[cut.recs[i].row], 10)
	}
	fromEarliest(cut.recs)
	return unwrap(newTraceCut("bailian", &cut))
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

// traceCut collects a trace's records as they are read, keeping only those
// the replay can include under its options, so that a slice of a trace of
// millions of rows does not hold them all: a record at or past Duration
// (after Speed) from the trace's start, or one with Limit records already
// kept that all came no later, is not kept. Exact for rows in any order:
// the start is the earliest arrival read so far (or the trace's own time 0,
// fromZero), never earlier than the true one, so a record it finds past
// Duration is past it from the true start too; newTrace still makes the
// exact cut. Rows in falling time order pass both tests as they come (each
// is the earliest yet), so whenever the kept records double, compact drops
// those the cut now excludes: what is kept stays within twice the cut's
// size (at least minCompact records), whatever the order.
type traceCut struct {
	opt      TraceOptions
	fromZero bool          // arrivals are the trace's own offsets (Mooncake), not from its earliest row
	earliest time.Duration // of every record read, kept or not
	latest   time.Duration // of the records kept
	read     int           // records read; each kept one carries its row (traceRecord.row)
	recs     []traceRecord
	next     int // compact when this many records are kept
}

// minCompact is the fewest kept records at which traceCut compacts.
var minCompact = 4096

func (c *traceCut) add(r traceRecord) {
	r.row = c.read
	c.read++
	if c.read == 1 || r.at < c.earliest {
		c.earliest = r.at
	}
	if c.past(r.at) {
		return
	}
	if c.opt.Limit > 0 && len(c.recs) >= c.opt.Limit && r.at >= c.latest {
		return
	}
	c.recs = append(c.recs, r)
	if len(c.recs) == 1 || r.at > c.latest {
		c.latest = r.at
	}
	if len(c.recs) >= max(c.next, minCompact) {
		c.compact()
		c.next = 2 * len(c.recs)
	}
}

// past reports whether an arrival is at or past Duration from the start
// known so far.
func (c *traceCut) past(at time.Duration) bool {
	if c.opt.Duration <= 0 {
		return false
	}
	start := c.earliest
	if c.fromZero {
		start = 0
	}
	return replayAt(at-start, c.opt.Speed) >= c.opt.Duration
}

// compact drops the kept records the cut now excludes: those past Duration
// from today's earliest arrival, and beyond the first Limit by arrival
// (ties in file order, as newTrace breaks them).
func (c *traceCut) compact() {
	c.recs = slices.DeleteFunc(c.recs, func(r traceRecord) bool { return c.past(r.at) })
	if c.opt.Limit > 0 && len(c.recs) > c.opt.Limit {
		slices.SortFunc(c.recs, func(a, b traceRecord) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.row, b.row)) })
		clear(c.recs[c.opt.Limit:])
		c.recs = c.recs[:c.opt.Limit]
	}
	c.latest = 0
	for i, r := range c.recs {
		if i == 0 || r.at > c.latest {
			c.latest = r.at
		}
	}
}

// replayAt is a trace offset at speed (0 means 1), as newTrace computes it.
func replayAt(at time.Duration, speed float64) time.Duration {
	if speed == 0 {
		speed = 1
	}
	return time.Duration(float64(at) / speed)
}

// traceGen replays trace records in arrival order; it is open-loop.
type traceGen struct {
	format   string
	skipped  int // rows the reader left out (BurstGPT: 0 request tokens)
	recs     []traceRecord
	i        int
	speed    float64
	ids      ids
	keys     []uint64             // scratch: one prompt's block keys (FromBlockKeys copies them)
	prefixes map[[2]uint64]string // Mooncake prefix keys by their first two ids
}

// newTraceCut is the replay of the records a traceCut kept: an error if
// the trace had none at all, an empty replay if the cut left none.
func newTraceCut(format string, c *traceCut) (*traceGen, error) {
	if c.read == 0 {
		return nil, fmt.Errorf("workload: %s: the trace holds no requests", format)
	}
	return replayOf(format, c.recs, c.opt), nil
}

// replayOf sorts the records by arrival, applies opt and makes the replay.
func replayOf(format string, recs []traceRecord, opt TraceOptions) *traceGen {
	speed := opt.Speed
	if speed == 0 {
		speed = 1
	}
	slices.SortStableFunc(recs, func(a, b traceRecord) int { return cmp.Compare(a.at, b.at) })
	for i := range recs {
		recs[i].at = replayAt(recs[i].at, speed)
	}
	if opt.Duration > 0 {
		n, _ := slices.BinarySearchFunc(recs, opt.Duration, func(r traceRecord, d time.Duration) int { return cmp.Compare(r.at, d) })
		recs = recs[:n]
	}
	if opt.Limit > 0 && len(recs) > opt.Limit {
		recs = recs[:opt.Limit]
	}
	if len(recs) < cap(recs)/2 {
		recs = slices.Clone(recs) // a slice of a long trace: let the rest go
	}
	return &traceGen{format: format, recs: recs, speed: speed, prefixes: map[[2]uint64]string{}}
}

// Replay returns a fresh replay of the trace w replays from its start, sharing
// its records (read once, never written after the reader is done), for a
// trace workload; false for any other. Replays may run in parallel: `llmlb
// bench` reads a trace once and replays it for each policy.
func Replay(w Workload) (Workload, bool) {
	g, ok := w.(*traceGen)
	if !ok {
		return nil, false
	}
	return &traceGen{format: g.format, skipped: g.skipped, recs: g.recs, speed: g.speed, prefixes: map[[2]uint64]string{}}, true
}

// TraceSummary describes a trace as it will be replayed: what `llmlb
// bench` prints before a run.
type TraceSummary struct {
	Format   string
	Requests int           // requests replayed (after Speed, Duration and Limit)
	Span     time.Duration // from the replay's start to its last arrival
	// Skipped counts the file's rows the reader left out: BurstGPT rows
	// with 0 request tokens (in the whole file, before any cut).
	Skipped int
}

// Summary returns the trace's TraceSummary.
func (g *traceGen) Summary() TraceSummary {
	s := TraceSummary{Format: g.format, Requests: len(g.recs), Skipped: g.skipped}
	if len(g.recs) > 0 {
		s.Span = g.recs[len(g.recs)-1].at
	}
	return s
}

// Summarize returns w's TraceSummary if w replays a trace (OpenTrace and
// the Read functions), false for a synthetic workload.
func Summarize(w Workload) (TraceSummary, bool) {
	if g, ok := w.(interface{ Summary() TraceSummary }); ok {
		return g.Summary(), true
	}
	return TraceSummary{}, false
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
	rec := &g.recs[g.i] // shared with other replays (Replay): read only
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
