package workload

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/tokenize"
)

func TestBurstGPTTrace(t *testing.T) {
	// A BOM, an extra column, rows out of order, a float timestamp, a failed
	// request (0 response tokens) and a row with 0 request tokens (skipped).
	const trace = "\ufeffTimestamp,Model,Request tokens,Response tokens,Total tokens,Log Type,Note\n" +
		"5,ChatGPT,472,18,490,Conversation log,a\n" +
		"3.25,GPT-4,1000,0,1000,API log,b\n" +
		"4,ChatGPT,0,7,7,Conversation log,c\n" +
		"10,ChatGPT,40,200,240,API log,d\n"
	// The same three requests, columns reordered and named loosely.
	const loose = " response TOKENS ,REQUEST TOKENS,timestamp\n" +
		"18,472,5\n" +
		"0,1000,3.25\n" +
		"200,40,10\n"
	for i, text := range []string{trace, loose} {
		w, err := ReadBurstGPT(strings.NewReader(text), TraceOptions{})
		if err != nil {
			t.Fatal(err)
		}
		sum, ok := Summarize(w)
		wantSum := TraceSummary{Format: "burstgpt", Requests: 3, Span: 6750 * time.Millisecond, Skipped: 1 - i}
		if !ok || sum != wantSum {
			t.Errorf("summary %+v, %v; want %+v (the first text's row with 0 request tokens skipped)", sum, ok, wantSum)
		}
		reqs := drive(t, w, fixed(time.Second))
		want := []struct {
			at            time.Duration
			input, output int
		}{
			{0, 1000, 1}, // a zero output is generated as one token
			{1750 * time.Millisecond, 472, 18},
			{6750 * time.Millisecond, 40, 200},
		}
		if len(reqs) != len(want) {
			t.Fatalf("%d requests, want %d (the row with 0 request tokens is skipped)", len(reqs), len(want))
		}
		for i, r := range reqs {
			if r.At != want[i].at || r.Prompt.Tokens != want[i].input || r.Output != want[i].output {
				t.Errorf("request %d: %d tokens in, %d out at %v; want %d, %d at %v", i, r.Prompt.Tokens, r.Output, r.At, want[i].input, want[i].output, want[i].at)
			}
			if len(r.Prompt.Blocks) != r.Prompt.Tokens/tokenize.BlockSize {
				t.Errorf("request %d: %d blocks for %d tokens", i, len(r.Prompt.Blocks), r.Prompt.Tokens)
			}
			if r.Session != "" || r.Profile.SessionKey != "" || r.Profile.PrefixKey != "" || r.Turn != 1 {
				t.Errorf("request %d: session %q, prefix key %q, turn %d; the trace has none", i, r.Profile.SessionKey, r.Profile.PrefixKey, r.Turn)
			}
		}
		if n := sharedBlocks(reqs[0].Prompt.Blocks, reqs[1].Prompt.Blocks); n != 0 {
			t.Errorf("two prompts share %d blocks, want none (the trace has no content)", n)
		}
	}
}

func TestBurstGPTRejectsBadInput(t *testing.T) {
	const head = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
	const good = "1,ChatGPT,10,5,15,API log\n"
	tests := []struct{ name, text, wantErr string }{
		{"empty", "", "burstgpt: reading the header"},
		{"no request tokens column", "Timestamp,Model,Response tokens\n1,ChatGPT,5\n",
			"lacks a Request tokens column (want Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type)"},
		{"an azure file", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,5,5\n", "lacks a Request tokens column"},
		{"header only", head, "no requests"},
		{"only rows with 0 request tokens", head + "1,ChatGPT,0,5,5,API log\n2,ChatGPT,0,0,0,API log\n", "every row has 0 Request tokens: 2 skipped"},
		{"negative request tokens", head + good + "2,ChatGPT,-4,5,1,API log\n", `burstgpt line 3: Request tokens "-4"`},
		{"float request tokens", head + good + "2,ChatGPT,12.5,5,17.5,API log\n", `burstgpt line 3: Request tokens "12.5"`},
		{"huge request tokens", head + good + "2,ChatGPT,99999999999,5,5,API log\n", `line 3: Request tokens "99999999999"`},
		{"negative response tokens", head + good + "2,ChatGPT,10,-1,9,API log\n", `burstgpt line 3: Response tokens "-1"`},
		{"float response tokens", head + good + "2,ChatGPT,10,3.0,13,API log\n", `burstgpt line 3: Response tokens "3.0"`},
		{"a skipped row is still checked", head + good + "2,ChatGPT,0,x,0,API log\n", `burstgpt line 3: Response tokens "x"`},
		{"negative timestamp", head + good + "-1,ChatGPT,10,5,15,API log\n", `burstgpt line 3: Timestamp "-1"`},
		{"NaN timestamp", head + good + "NaN,ChatGPT,10,5,15,API log\n", `line 3: Timestamp "NaN"`},
		{"infinite timestamp", head + good + "+Inf,ChatGPT,10,5,15,API log\n", `line 3: Timestamp "+Inf"`},
		{"huge timestamp", head + good + "1e10,ChatGPT,10,5,15,API log\n", `line 3: Timestamp "1e10"`},
		{"no timestamp", head + good + ",ChatGPT,10,5,15,API log\n", `line 3: Timestamp ""`},
		{"short row", head + good + "2,ChatGPT,10\n", "burstgpt line 3: 3 fields, want at least 4"},
		{"bad quoting", head + good + "2,\"ChatGPT,10,5,15,API log\n", "burstgpt: parse error on line 3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkRejects(t, ReadBurstGPT, tt.text, tt.wantErr)
		})
	}
	if _, err := ReadBurstGPT(strings.NewReader(head+good), TraceOptions{Speed: -1}); err == nil {
		t.Error("negative speed accepted")
	}
}

func TestOpenTraceTellsBurstGPTFromAzure(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string { return writeFile(t, dir, name, text) }
	// Each file fails to read as the other format, so a wrong guess is an
	// error; the gaps tell the readers' time units apart as well.
	burst := write("BurstGPT_1.csv", "\ufeff\"Timestamp\",Model,Request tokens,Response tokens,Total tokens,Log Type\n"+
		"0,ChatGPT,100,10,110,Conversation log\n7,GPT-4,50,0,50,API log\n")
	azure2023 := write("azure_code.CSV", "TIMESTAMP,ContextTokens,GeneratedTokens\n"+
		"2023-11-16 18:17:03.00,100,10\n2023-11-16 18:17:05.50,50,0\n")
	azure2024 := write("AzureLLMInferenceTrace_conv_1week.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"+
		"2024-05-10 00:00:00.000000+00:00,100,10\n2024-05-10 00:00:00.250000+00:00,50,0\n")
	for _, tt := range []struct {
		path, format string
		gap          time.Duration
	}{
		{burst, "", 7 * time.Second},
		{burst, "burstgpt", 7 * time.Second},
		{azure2023, "", 2500 * time.Millisecond},
		{azure2024, "", 250 * time.Millisecond},
		{azure2024, "azure", 250 * time.Millisecond},
	} {
		w, err := OpenTrace(tt.path, tt.format, TraceOptions{})
		if err != nil {
			t.Fatalf("%s as %q: %v", filepath.Base(tt.path), tt.format, err)
		}
		reqs := drive(t, w, fixed(time.Second))
		if len(reqs) != 2 || reqs[1].At-reqs[0].At != tt.gap || reqs[0].Prompt.Tokens != 100 {
			t.Errorf("%s as %q: %d requests, gap %v; want 2, %v", filepath.Base(tt.path), tt.format, len(reqs), reqs[len(reqs)-1].At-reqs[0].At, tt.gap)
		}
	}
	// A named format is obeyed, even when it is the wrong one.
	if _, err := OpenTrace(burst, "azure", TraceOptions{}); err == nil || !strings.Contains(err.Error(), "lacks a ContextTokens column") {
		t.Errorf("BurstGPT file read as azure: %v, want a missing ContextTokens column", err)
	}
	if _, err := OpenTrace(azure2024, "burstgpt", TraceOptions{}); err == nil || !strings.Contains(err.Error(), "lacks a Request tokens column") {
		t.Errorf("Azure file read as burstgpt: %v, want a missing Request tokens column", err)
	}
}

func FuzzReadBurstGPT(f *testing.F) {
	f.Add("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,472,18,490,Conversation log\n3.5,GPT-4,10,0,10,API log\n")
	f.Add("\ufeffresponse tokens,timestamp,request tokens,x\n1,0,0,\n2,1e3,7,\"y\"\n")
	f.Fuzz(func(t *testing.T, text string) {
		checkReplay(t, ReadBurstGPT, text, TraceOptions{Speed: 2}, nil)
		checkReplay(t, ReadBurstGPT, text, TraceOptions{Speed: 0.5, Duration: 10 * time.Second, Limit: 3}, nil) // cut while read (traceCut)
	})
}
