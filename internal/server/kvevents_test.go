package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/discovery"
	"github.com/llmlb/llmlb/internal/modeltok"
	"github.com/llmlb/llmlb/internal/proxy"
	"github.com/llmlb/llmlb/internal/request"
	"github.com/llmlb/llmlb/internal/simreplica"
	"github.com/llmlb/llmlb/internal/testutil/qwentok"
	"github.com/llmlb/llmlb/internal/tokenize"
)

// TestKVEventsRouteToTheReplicaThatHoldsThePrefix runs llmlb (policy cost)
// in front of simulated replicas that publish their KV cache events over
// ZMQ. A prompt computed on sim-2 behind llmlb's back reaches llmlb only
// through sim-2's events, and the next request with that prefix goes
// there; sim-2's prefix cache reset (AllBlocksCleared) empties its entries.
//
// Twice: with the replicas hashing blocks as llmlb does (the
// pseudo-tokenizer), and as a real engine does: the model's own tokenizer
// and chat template, blocks hashed with SHA-256 from a random seed per
// replica, events carrying token ids; llmlb then tokenizes with the same
// tokenizer (tokenizers[]) and keys the events by their token ids.
func TestKVEventsRouteToTheReplicaThatHoldsThePrefix(t *testing.T) {
	if testing.Short() {
		t.Skip("opens ZMQ sockets")
	}
	t.Run("engine hashes", func(t *testing.T) { testKVEventsRouting(t, "") })
	t.Run("model tokenizer", func(t *testing.T) { testKVEventsRouting(t, qwentok.Dir(t)) })
}

func testKVEventsRouting(t *testing.T, tokenizerDir string) {
	opts := simreplica.FleetOptions{Replicas: 3, Model: model, Seed: 1, Logger: testLogger()}
	blocksOf := func(content string) []uint64 {
		return tokenize.FromText(tokenize.RenderChat([]tokenize.Message{{Role: "user", Content: content}})).Blocks
	}
	if tokenizerDir != "" {
		tok, err := modeltok.Load(tokenizerDir)
		if err != nil {
			t.Fatal(err)
		}
		opts.Tokenizer = tok
		blocksOf = func(content string) []uint64 {
			ids, err := tok.ChatTokens([]tokenize.Message{{Role: "user", Content: content}})
			if err != nil {
				t.Fatal(err)
			}
			return tokenize.FromTokenIDs(ids).Blocks
		}
	}
	fleet, err := simreplica.StartFleet(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fleet.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	pubs := make([]*simreplica.KVEvents, len(fleet.Replicas))
	for i, r := range fleet.Replicas {
		if pubs[i], err = r.PublishKVEvents(ctx, simreplica.KVEventsOptions{Endpoint: "tcp://127.0.0.1:0", Replay: "tcp://127.0.0.1:0"}); err != nil {
			t.Fatal(err)
		}
		go pubs[i].Run(ctx)
	}
	e := startOn(t, fleet, func(c *config.Config) {
		c.Routing.Policy = "cost"
		for i := range c.Replicas {
			c.Replicas[i].KVEvents, c.Replicas[i].KVEventsReplay = pubs[i].Endpoint(), pubs[i].ReplayEndpoint()
		}
		if tokenizerDir != "" {
			c.Tokenizers = []modeltok.Config{{Models: []string{model}, Path: tokenizerDir}}
		}
	})
	idx := e.srv.KVEventsIndex()
	if idx == nil {
		t.Fatal("no KV events index though every replica publishes")
	}
	direct := func(rep *simreplica.Replica, content string) {
		t.Helper()
		res, err := http.Post(rep.URL()+"/v1/chat/completions", "application/json", strings.NewReader(chatBody(content, 1)))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Fatalf("direct request to %s: %d", rep.Name(), res.StatusCode)
		}
	}
	// ZMQ's PUB drops what it sends before a subscription arrives: probe
	// each replica until one of its events is seen.
	for _, r := range fleet.Replicas {
		probe := 0
		eventually(t, "llmlb subscribed to "+r.Name()+"'s events", func() bool {
			probe++
			content := fmt.Sprintf("probe %d %s", probe, strings.Repeat("x", 200))
			direct(r, content)
			_, n := idx.Match(r.Name(), blocksOf(content), time.Now())
			return n > 0
		})
	}
	// Each replica in turn computes a prompt behind llmlb's back; the next
	// request with that prefix must go there. The order is the reverse of
	// cost's rotation among equals, so a decision blind to the events
	// fails here.
	for i := range fleet.Replicas {
		holder := fleet.Replicas[len(fleet.Replicas)-1-i]
		shared := strings.Repeat(fmt.Sprintf("shared system prompt %d. ", i), 600)
		direct(holder, shared+"first question")
		want := blocksOf(shared)
		eventually(t, holder.Name()+"'s events report the shared prefix", func() bool {
			gpu, _ := idx.Match(holder.Name(), want, time.Now())
			return gpu == len(want)
		})
		// Every prompt shares the chat template's head (a default system
		// prompt, with the model's template): the others may hold that.
		head := tokenize.SharedBlocks(tokenize.Prompt{Blocks: want}, tokenize.Prompt{Blocks: blocksOf("another prompt")})
		for _, other := range fleet.Replicas {
			if gpu, _ := idx.Match(other.Name(), want, time.Now()); other != holder && gpu > head {
				t.Fatalf("%s's events report %d blocks of a prompt it never saw (%d shared by every prompt)", other.Name(), gpu, head)
			}
		}
		code, rep, body := e.chat(chatBody(shared+"second question", 1), nil)
		if code != http.StatusOK {
			t.Fatalf("%d %s", code, body)
		}
		if rep != holder.Name() {
			t.Fatalf("routed to %s, want %s whose events hold the prefix", rep, holder.Name())
		}
	}
	if tokenizerDir != "" {
		// sim-3: a decision blind to the events sends the turn to sim-1.
		agentTurnRoutesToItsHolder(t, e, fleet.Replicas[2], tokenizerDir)
		// sim-1: a decision blind to the events sends this one to sim-2.
		claudeTurnRoutesToItsHolder(t, e, fleet.Replicas[0], tokenizerDir)
		// sim-2: a decision blind to the events sends this one elsewhere.
		codexTurnRoutesToItsHolder(t, e, fleet.Replicas[1], tokenizerDir)
	}
	holder := fleet.Replicas[1]

	// Reset sim-2's prefix cache once its requests are done: AllBlocksCleared.
	eventually(t, "sim-2 resets its prefix cache", pubs[1].ResetPrefixCache)
	eventually(t, "sim-2's entries emptied", func() bool {
		st, ok := idx.Stats(holder.Name())
		return ok && st.Blocks == 0
	})
}

// publishing starts n simulated replicas, each publishing its KV cache
// events (and serving replays) until the test ends.
func publishing(t *testing.T, n int) (*simreplica.Fleet, []*simreplica.KVEvents) {
	t.Helper()
	fleet, err := simreplica.StartFleet(context.Background(), simreplica.FleetOptions{Replicas: n, Model: model, Seed: 1, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fleet.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	pubs := make([]*simreplica.KVEvents, n)
	for i, r := range fleet.Replicas {
		if pubs[i], err = r.PublishKVEvents(ctx, simreplica.KVEventsOptions{Endpoint: "tcp://127.0.0.1:0", Replay: "tcp://127.0.0.1:0"}); err != nil {
			t.Fatal(err)
		}
		go pubs[i].Run(ctx)
	}
	return fleet, pubs
}

// seesEvents waits until llmlb's index holds a prompt that replica rep
// (named name in llmlb) computed behind llmlb's back: llmlb subscribes to
// its events. ZMQ's PUB drops what it sends before a subscription arrives,
// so it sends probes until one is seen.
func (e *env) seesEvents(rep *simreplica.Replica, name string) {
	e.t.Helper()
	probe := 0
	eventually(e.t, "llmlb reads "+name+"'s events", func() bool {
		probe++
		content := fmt.Sprintf("probe %d %s", probe, strings.Repeat("x", 200))
		res, err := http.Post(rep.URL()+"/v1/chat/completions", "application/json", strings.NewReader(chatBody(content, 1)))
		if err != nil {
			e.t.Fatal(err)
		}
		res.Body.Close()
		idx := e.srv.KVEventsIndex()
		if idx == nil {
			return false
		}
		blocks := tokenize.FromText(tokenize.RenderChat([]tokenize.Message{{Role: "user", Content: content}})).Blocks
		_, n := idx.Match(name, blocks, time.Now())
		return n > 0
	})
}

// subscribed reports whether llmlb subscribes to replica name's events.
func (e *env) subscribed(name string) bool {
	for _, s := range e.srv.KVEventsSources() {
		if s.Replica == name {
			return true
		}
	}
	return false
}

// TestKVEventsFollowTheAdminAPI adds a publishing replica through POST
// /admin/replicas with kv_events: llmlb reads its events; removing it
// unsubscribes and forgets its entries.
func TestKVEventsFollowTheAdminAPI(t *testing.T) {
	if testing.Short() {
		t.Skip("opens ZMQ sockets")
	}
	fleet, pubs := publishing(t, 2)
	e := startURLs(t, fleet.URLs()[:1], testLogger(), func(c *config.Config) {
		c.Routing.Policy = "cost"
		c.AdminToken = "s3cret"
	})
	if e.srv.KVEventsIndex() != nil {
		t.Fatal("an index before any replica publishes")
	}
	admin := func(method, path, body string) int {
		req, _ := http.NewRequest(method, e.admin+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer s3cret")
		res, err := e.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	add := fmt.Sprintf(`{"name":"added","url":%q,"models":[%q],"kv_events":%q,"kv_events_replay":%q}`,
		fleet.Replicas[1].URL(), model, pubs[1].Endpoint(), pubs[1].ReplayEndpoint())
	if code := admin(http.MethodPost, "/admin/replicas", add); code != http.StatusCreated {
		t.Fatalf("POST /admin/replicas: %d", code)
	}
	if !e.subscribed("added") {
		t.Fatalf("not subscribed to the added replica: %v", e.srv.KVEventsSources())
	}
	e.seesEvents(fleet.Replicas[1], "added")
	metrics := func() string {
		res, err := e.http.Get(e.admin + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if m := metrics(); !strings.Contains(m, `llmlb_kv_events_subscribed{replica="added"} 1`) || !strings.Contains(m, `llmlb_kv_events_blocks{replica="added"}`) {
		t.Fatal("/metrics does not show the added replica's subscription and blocks")
	}
	if code := admin(http.MethodDelete, "/admin/replicas/added", ""); code != http.StatusOK && code != http.StatusNoContent {
		t.Fatalf("DELETE /admin/replicas/added: %d", code)
	}
	if e.subscribed("added") || e.srv.KVEventsIndex().Publishes("added") {
		t.Fatal("still subscribed to, or holding entries of, a removed replica")
	}
	if strings.Contains(metrics(), `llmlb_kv_events_subscribed{replica="added"}`) {
		t.Fatal("/metrics still shows the removed replica's subscription")
	}
}

// TestKVEventsFollowDiscovery discovers publishing replicas whose KV event
// endpoints the source gives: llmlb reads their events; one that leaves
// the set is unsubscribed once removed.
func TestKVEventsFollowDiscovery(t *testing.T) {
	if testing.Short() {
		t.Skip("opens ZMQ sockets")
	}
	fleet, pubs := publishing(t, 2)
	src := &testSource{sets: make(chan []discovery.Target)}
	for i, r := range fleet.Replicas {
		src.first = append(src.first, discovery.Target{Name: "disc-" + r.Name(), URL: r.URL(),
			KVEvents: pubs[i].Endpoint(), KVEventsReplay: pubs[i].ReplayEndpoint()})
	}
	e := startURLs(t, fleet.URLs(), testLogger(), func(c *config.Config) {
		c.Routing.Policy = "cost"
		c.Replicas = nil
	}, WithDiscovery(src))
	for _, r := range fleet.Replicas {
		e.seesEvents(r, "disc-"+r.Name())
	}
	leaving := src.first[1].Name
	src.sets <- src.first[:1]
	e.waitReplicas(leaving+" removed", func(rs []balancer.ReplicaStatus) bool {
		_, ok := find(rs, leaving)
		return !ok
	})
	if e.subscribed(leaving) || e.srv.KVEventsIndex().Publishes(leaving) {
		t.Fatal("still subscribed to, or holding entries of, a replica discovery removed")
	}
	if !e.subscribed(src.first[0].Name) {
		t.Fatal("unsubscribed from the replica that stayed")
	}
}

// TestKVEventsFollowAReload reloads the replica list: a replica added
// with kv_events is subscribed to; a reload that drops only its kv_events
// unsubscribes and keeps the replica; one that sets them again
// subscribes again.
func TestKVEventsFollowAReload(t *testing.T) {
	if testing.Short() {
		t.Skip("opens ZMQ sockets")
	}
	fleet, pubs := publishing(t, 2)
	e := startURLs(t, fleet.URLs()[:1], testLogger(), func(c *config.Config) { c.Routing.Policy = "cost" })
	first := config.Replica{Name: "sim-1", URL: fleet.Replicas[0].URL()}
	second := config.Replica{Name: "sim-2", URL: fleet.Replicas[1].URL(), KVEvents: pubs[1].Endpoint(), KVEventsReplay: pubs[1].ReplayEndpoint()}
	reload := func(list ...config.Replica) {
		t.Helper()
		if _, _, err := e.srv.Reload(list); err != nil {
			t.Fatal(err)
		}
	}
	reload(first, second)
	e.seesEvents(fleet.Replicas[1], "sim-2")

	quiet := second
	quiet.KVEvents, quiet.KVEventsReplay = "", ""
	added, removed, err := e.srv.Reload([]config.Replica{first, quiet})
	if err != nil || len(added)+len(removed) != 0 {
		t.Fatalf("dropping kv_events replaced the replica: added %v removed %v, %v", added, removed, err)
	}
	if e.subscribed("sim-2") || e.srv.KVEventsIndex().Publishes("sim-2") {
		t.Fatal("still subscribed after kv_events was dropped")
	}
	reload(first, second)
	e.seesEvents(fleet.Replicas[1], "sim-2")
	reload(first)
	if e.subscribed("sim-2") {
		t.Fatal("still subscribed to a replica the reload removed")
	}
}

// agentTurnRoutesToItsHolder: an agent's turn with tool definitions, a
// tool call and its result, sent to holder behind llmlb's back; its next
// turn through llmlb must go to holder, whose events hold the turn's
// blocks keyed by the tokens llmlb renders (tools included) for it.
func agentTurnRoutesToItsHolder(t *testing.T, e *env, holder *simreplica.Replica, tokenizerDir string) {
	t.Helper()
	tok, err := modeltok.Load(tokenizerDir)
	if err != nil {
		t.Fatal(err)
	}
	tools := `[{"type":"function","function":{"name":"read_file","description":"Reads a file.","parameters":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}}}]`
	turn := `[{"role":"system","content":"` + strings.Repeat("You are a coding agent. ", 150) + `"},` +
		`{"role":"user","content":"What is in main.go?"},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"read_file","arguments":"{\"path\": \"main.go\"}"}}]},` +
		`{"role":"tool","tool_call_id":"c1","content":"package main"}`
	first := `{"model":"` + model + `","max_tokens":1,"tools":` + tools + `,"messages":` + turn + `]}`
	next := `{"model":"` + model + `","max_tokens":1,"tools":` + tools + `,"messages":` + turn +
		`,{"role":"assistant","content":"It declares package main."},{"role":"user","content":"Anything else?"}]}`
	res, err := http.Post(holder.URL()+"/v1/chat/completions", "application/json", strings.NewReader(first))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("direct agent turn: %d", res.StatusCode)
	}
	ids, err := tok.ChatRequestTokens(request.ChatRequest{Messages: json.RawMessage(turn + "]"), Tools: json.RawMessage(tools)})
	if err != nil {
		t.Fatal(err)
	}
	want := tokenize.FromTokenIDs(ids).Blocks
	idx := e.srv.KVEventsIndex()
	eventually(t, holder.Name()+"'s events report the agent's turn", func() bool {
		gpu, _ := idx.Match(holder.Name(), want, time.Now())
		return gpu == len(want)
	})
	code, rep, body := e.chat(next, nil)
	if code != http.StatusOK {
		t.Fatalf("%d %s", code, body)
	}
	if rep != holder.Name() {
		t.Fatalf("agent's next turn routed to %s, want %s whose events hold its context", rep, holder.Name())
	}
	// The engine's usage.prompt_tokens confirms llmlb's count of every
	// prompt it tokenized, the agent's included.
	res, err = e.http.Get(e.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(m), `llmlb_tokenizer_checks_total{model="`+model+`",result="match"}`) || strings.Contains(string(m), `result="mismatch"`) {
		t.Fatalf("tokenizer checks: want matches only, /metrics has\n%s", grepLines(string(m), "llmlb_tokenizer_checks_total"))
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for line := range strings.Lines(s) {
		if strings.Contains(line, sub) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "")
}

// claudeTurnRoutesToItsHolder: a Claude Code turn (/v1/messages: system
// blocks with the per-request billing header, tools, a tool_use and its
// tool_result) sent to holder behind llmlb's back; the next turn, with
// another billing nonce, through llmlb must go to holder, whose events
// hold the turn's blocks keyed by the tokens llmlb renders for it (the
// chat vLLM turns the request into).
func claudeTurnRoutesToItsHolder(t *testing.T, e *env, holder *simreplica.Replica, tokenizerDir string) {
	t.Helper()
	tok, err := modeltok.Load(tokenizerDir)
	if err != nil {
		t.Fatal(err)
	}
	system := func(cch string) string {
		return `[{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.117.48f; cc_entrypoint=cli; cch=` + cch + `;"},` +
			`{"type":"text","text":"` + strings.Repeat("You are Claude Code, a coding agent. ", 120) + `"}]`
	}
	tools := `[{"name":"Read","description":"Reads a file.","input_schema":{"type":"object","properties":{"file_path":{"type":"string"}},"required":["file_path"]}}]`
	turn := `[{"role":"user","content":"What is in main.go?"},` +
		`{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"Read","input":{"file_path":"main.go"}}]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"package main"}]}`
	body := func(cch, messages string) string {
		return `{"model":"` + model + `","max_tokens":1,"system":` + system(cch) + `,"tools":` + tools + `,"messages":` + messages + `}`
	}
	res, err := http.Post(holder.URL()+"/v1/messages", "application/json", strings.NewReader(body("71fea", turn+"]")))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("direct Claude Code turn: %d", res.StatusCode)
	}
	ids, err := tok.ChatRequestTokens(request.ChatRequest{Anthropic: true, System: json.RawMessage(system("71fea")),
		Messages: json.RawMessage(turn + "]"), Tools: json.RawMessage(tools)})
	if err != nil {
		t.Fatal(err)
	}
	want := tokenize.FromTokenIDs(ids).Blocks
	idx := e.srv.KVEventsIndex()
	eventually(t, holder.Name()+"'s events report the Claude Code turn", func() bool {
		gpu, _ := idx.Match(holder.Name(), want, time.Now())
		return gpu == len(want)
	})
	matched, _ := tokenizerChecks(t, e)
	next := body("0aaa9", turn+`,{"role":"assistant","content":[{"type":"text","text":"It declares package main."}]},{"role":"user","content":"Anything else?"}]`)
	req, _ := http.NewRequest(http.MethodPost, e.proxy+"/v1/messages", strings.NewReader(next))
	req.Header.Set("Content-Type", "application/json")
	res, err = e.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", res.StatusCode, b)
	}
	if rep := res.Header.Get(proxy.HeaderReplica); rep != holder.Name() {
		t.Fatalf("Claude Code's next turn routed to %s, want %s whose events hold its context", rep, holder.Name())
	}
	// The engine's usage (input_tokens) confirms llmlb's count of it. The
	// observer counts it once the answer has left (a JSON answer is flushed
	// before the handler's bookkeeping), so the count may trail the read.
	m, mis := matched, 0.0
	eventually(t, "the Claude Code turn's tokenizer check", func() bool {
		m, mis = tokenizerChecks(t, e)
		return m != matched || mis != 0
	})
	if m != matched+1 || mis != 0 {
		t.Fatalf("tokenizer checks after the Claude Code turn: %v matches (%v before), %v mismatches", m, matched, mis)
	}
}

// codexTurnRoutesToItsHolder: a Codex-style turn (/v1/responses:
// instructions, flat function tools, a message, a function_call and its
// function_call_output) sent to holder behind llmlb's back; the next
// turn through llmlb must go to holder, whose events hold the turn's
// blocks keyed by the tokens llmlb renders for it (the chat vLLM turns
// the request into).
func codexTurnRoutesToItsHolder(t *testing.T, e *env, holder *simreplica.Replica, tokenizerDir string) {
	t.Helper()
	tok, err := modeltok.Load(tokenizerDir)
	if err != nil {
		t.Fatal(err)
	}
	instructions := `"` + strings.Repeat("You are Codex, a coding agent in the user's terminal. ", 80) + `"`
	tools := `[{"type":"function","name":"shell","description":"Runs a shell command.","strict":false,` +
		`"parameters":{"type":"object","properties":{"command":{"type":"array","items":{"type":"string"}}},"required":["command"]}}]`
	turn := `[{"type":"message","role":"user","content":[{"type":"input_text","text":"What does main.go do?"}]},` +
		`{"type":"function_call","call_id":"call_1","name":"shell","arguments":"{\"command\":[\"cat\",\"main.go\"]}"},` +
		`{"type":"function_call_output","call_id":"call_1","output":"package main\n\nfunc main() {}"}`
	body := func(input string) string {
		return `{"model":"` + model + `","max_output_tokens":1,"instructions":` + instructions + `,"tools":` + tools + `,"input":` + input + `}`
	}
	res, err := http.Post(holder.URL()+"/v1/responses", "application/json", strings.NewReader(body(turn+"]")))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("direct Codex turn: %d %s", res.StatusCode, b)
	}
	ids, err := tok.ChatRequestTokens(request.ChatRequest{Responses: true, Instructions: json.RawMessage(instructions),
		Input: json.RawMessage(turn + "]"), Tools: json.RawMessage(tools)})
	if err != nil {
		t.Fatal(err)
	}
	want := tokenize.FromTokenIDs(ids).Blocks
	idx := e.srv.KVEventsIndex()
	eventually(t, holder.Name()+"'s events report the Codex turn", func() bool {
		gpu, _ := idx.Match(holder.Name(), want, time.Now())
		return gpu == len(want)
	})
	matched, _ := tokenizerChecks(t, e)
	next := body(turn + `,{"type":"message","role":"assistant","content":[{"type":"output_text","text":"It does nothing."}]},` +
		`{"type":"message","role":"user","content":[{"type":"input_text","text":"Make it print hello."}]}]`)
	req, _ := http.NewRequest(http.MethodPost, e.proxy+"/v1/responses", strings.NewReader(next))
	req.Header.Set("Content-Type", "application/json")
	res, err = e.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", res.StatusCode, b)
	}
	if rep := res.Header.Get(proxy.HeaderReplica); rep != holder.Name() {
		t.Fatalf("Codex's next turn routed to %s, want %s whose events hold its context", rep, holder.Name())
	}
	// The engine's usage (input_tokens) confirms llmlb's count of it.
	m, mis := matched, 0.0
	eventually(t, "the Codex turn's tokenizer check", func() bool {
		m, mis = tokenizerChecks(t, e)
		return m != matched || mis != 0
	})
	if m != matched+1 || mis != 0 {
		t.Fatalf("tokenizer checks after the Codex turn: %v matches (%v before), %v mismatches", m, matched, mis)
	}
}

// tokenizerChecks reads llmlb_tokenizer_checks_total's matches and
// mismatches (all models) from /metrics.
func tokenizerChecks(t *testing.T, e *env) (match, mismatch float64) {
	t.Helper()
	res, err := e.http.Get(e.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if !strings.HasPrefix(line, "llmlb_tokenizer_checks_total{") {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		if strings.Contains(line, `result="match"`) {
			match += v
		} else {
			mismatch += v
		}
	}
	return match, mismatch
}
