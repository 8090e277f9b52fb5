package bench

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"encoding/xml"
	"reflect"
	"strings"
	"testing"
	"time"
)

// sampleReport is a small hand-made report for the output tests.
func sampleReport() *Report {
	res := func(policy string, p99, hit float64) Result {
		return Result{
			Policy: policy, Requests: 100, Completed: 98, Finished: 100,
			TTFT: Percentiles{P50: 0.2, P90: 0.8, P99: p99}, E2E: Percentiles{P50: 1.5, P90: 3, P99: 9},
			OutputTokensPerSec: 1234.5, PrefixHitRate: hit, PrefillTokens: 1_234_567, Preemptions: 3,
			ImbalanceIndex: 1.7, MaxReplicaShare: 0.31, CacheCeiling: 0.75,
			TTFTSlowdown: Percentiles{P50: 1.2, P90: 3, P99: 15},
			TTFTShort:    Percentiles{P50: 0.1, P90: 0.3, P99: 0.9}, ShortRequests: 90,
			TTFTLong: Percentiles{P50: 5, P90: 7, P99: 9}, LongRequests: 10,
			Turns2:             &TurnStats{Requests: 40, TTFT: Percentiles{P50: 0.1, P90: 0.2, P99: 0.3}, PromptTokens: 1000, CachedTokens: 800, PrefillTokens: 200},
			TTFTQuantiles:      []Quantile{{0.5, 0.2}, {0.9, 0.8}, {0.99, p99}, {1, p99 * 2}},
			ShareWindowSeconds: 10,
			Share:              [][]float64{{0.25, 0.25, 0.25, 0.25}, {0.5, 0.5, 0, 0}, {0, 0, 0, 0}},
			WallSeconds:        1.5,
		}
	}
	return &Report{
		Workload: "longshort <test>", Replicas: 4, Profile: "2x3090-tp2", DurationSeconds: 30, Seed: 1,
		Results: []Result{res("rr", 4.2, 0.1), res("llmlb", 0.65, 0.6)},
	}
}

func TestJSONRoundTrip(t *testing.T) {
	rep := sampleReport()
	var buf bytes.Buffer
	if err := rep.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	got, err := ReadJSON(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, rep) {
		t.Fatalf("round trip differs:\n got %+v\nwant %+v", got, rep)
	}
}

func TestReadJSONRejectsGarbage(t *testing.T) {
	if _, err := ReadJSON(strings.NewReader("{not json")); err == nil || !strings.HasPrefix(err.Error(), "bench: ") {
		t.Fatalf("err = %v, want a bench: error", err)
	}
}

func TestWriteTable(t *testing.T) {
	var buf bytes.Buffer
	rep := sampleReport()
	rep.Slow = []string{"replica-2:2"}
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"policy", "rr", "llmlb", "4.20s", "650ms", "turns 2+", "80.0%",
		"ceiling", "75.0%", "short < 8192 tokens", "1.2x", "15x", "900ms", "9.00s", ", slow replica-2:2\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

// TestWriteHTML checks that the report is well-formed markup (parsed as XML
// after the doctype), self-contained and has the three charts.
func TestWriteHTML(t *testing.T) {
	var buf bytes.Buffer
	if err := sampleReport().WriteHTML(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if n := strings.Count(out, "<svg"); n < 4 {
		t.Errorf("%d <svg> elements, want CDF, two bar charts and one share chart per policy", n)
	}
	for _, bad := range []string{"<script src", "<link", "http://", "https://"} {
		if strings.Contains(strings.ReplaceAll(out, `xmlns="http://www.w3.org/2000/svg"`, ""), bad) {
			t.Errorf("report references an external asset (%q)", bad)
		}
	}
	if strings.Contains(out, "<test>") {
		t.Error("workload name not escaped")
	}
	rep := sampleReport()
	rep.Flaps, rep.Slow = []string{"replica-1:15s"}, []string{"replica-2:2", "replica-3:1.5"}
	buf.Reset()
	if err := rep.WriteHTML(&buf); err != nil {
		t.Fatal(err)
	}
	if want := "flapping <code>replica-1:15s</code>, slower <code>replica-2:2</code>, <code>replica-3:1.5</code>."; !strings.Contains(buf.String(), want) {
		t.Errorf("report does not name the faults: want %q", want)
	}
	body := strings.TrimPrefix(out, "<!DOCTYPE html>\n")
	body = strings.Replace(body, `<meta charset="utf-8">`, `<meta charset="utf-8"/>`, 1)
	dec := xml.NewDecoder(strings.NewReader(body))
	dec.Strict = true
	for {
		_, err := dec.Token()
		if err != nil {
			if err.Error() == "EOF" {
				break
			}
			t.Fatalf("report is not well-formed: %v", err)
		}
	}
}

func TestWriteHTMLEmptyReport(t *testing.T) {
	rep := &Report{Workload: "x", Replicas: 2, Results: []Result{{Policy: "rr"}}}
	var buf bytes.Buffer
	if err := rep.WriteHTML(&buf); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "<svg") {
		t.Fatal("no svg")
	}
}

// equalJSON compares two values by their JSON encoding (what users see).
func equalJSON(t *testing.T, a, b any) bool {
	t.Helper()
	ja, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	jb, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(ja, jb)
}

// TestRequestLog: with KeepRequests every routed request has one record,
// consistent with the report's counts, and WriteRequestsCSV writes them
// all; without it nothing is kept.
func TestRequestLog(t *testing.T) {
	opts := testOptions(t, "agentic", 2, 2*time.Minute, "rr", "cost")
	opts.Drain = 10 * time.Second // leave some unfinished
	plain, err := Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	opts.KeepRequests = true
	rep, err := Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	rows := 0
	for i, res := range rep.Results {
		if plain.Results[i].RequestLog != nil {
			t.Errorf("%s: a request log without KeepRequests", res.Policy)
		}
		if !equalJSON(t, deterministic(plain.Results)[i], deterministic(rep.Results)[i]) {
			t.Errorf("%s: keeping the request log changed the results", res.Policy)
		}
		if got, want := len(res.RequestLog), res.Finished+res.Unfinished; got != want || got == 0 {
			t.Fatalf("%s: %d records, want finished + unfinished = %d", res.Policy, got, want)
		}
		finished, sessions, expected := 0, 0, 0
		for j, q := range res.RequestLog {
			if q.ExpectedTTFT > 0 {
				expected++
			}
			if q.ExpectedCachedTokens < 0 || q.ExpectedCachedTokens > q.PromptTokens || q.ExpectedTTFT < 0 {
				t.Fatalf("%s: inconsistent expectation %+v", res.Policy, q)
			}
			if j > 0 && q.ID <= res.RequestLog[j-1].ID {
				t.Fatalf("%s: records not in request order at %d", res.Policy, j)
			}
			if q.CachedTokens < 0 || q.CachedTokens > q.PromptTokens || q.TTFT < 0 || q.TTFT > q.E2E+1e-9 ||
				(q.Replica != "replica-1" && q.Replica != "replica-2") || q.Turn < 1 {
				t.Fatalf("%s: inconsistent record %+v", res.Policy, q)
			}
			if q.Finished {
				finished++
			} else if q.OutputTokens != 0 {
				t.Fatalf("%s: unfinished record with output: %+v", res.Policy, q)
			}
			if q.Session != "" {
				sessions++
			}
		}
		if finished != res.Finished || sessions != len(res.RequestLog) {
			t.Errorf("%s: %d finished records (report %d), %d with a session of %d", res.Policy, finished, res.Finished, sessions, len(res.RequestLog))
		}
		// cost estimates every request's TTFT; rr estimates nothing.
		if want := map[string]int{"rr": 0, "cost": len(res.RequestLog)}[res.Policy]; expected != want {
			t.Errorf("%s: %d records with an expected TTFT, want %d", res.Policy, expected, want)
		}
		rows += len(res.RequestLog)
	}
	var buf bytes.Buffer
	if err := rep.WriteRequestsCSV(&buf); err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(&buf).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != rows+1 || strings.Join(recs[0], ",") != strings.Join(requestsHeader, ",") {
		t.Fatalf("CSV: %d rows with header %v, want %d", len(recs), recs[0], rows+1)
	}
	if recs[1][0] != "rr" || recs[len(recs)-1][0] != "cost" {
		t.Errorf("CSV rows not in the report's policy order: first %v, last %v", recs[1], recs[len(recs)-1])
	}
}
