// Command proxybench is the Go half of scripts/proxybench.sh (BENCHMARKS.md, "Proxy efficiency vs NGINX"): a
// static upstream that answers instantly, so that the proxy in front of it
// dominates what is measured, and two small clients wrk cannot be: the time
// to the first SSE chunk, and N streams held open (memory per stream); and
// goproxy, the floor a Go proxy starts from: a bare httputil.ReverseProxy
// over a keep-alive http.Transport, nothing of llmlb's.
//
//	proxybench upstream -listen 127.0.0.1:18100
//	proxybench goproxy -listen 127.0.0.1:18104 -upstream http://127.0.0.1:18100
//	proxybench ttfb -url http://127.0.0.1:18080/v1/chat/completions -n 2000
//	proxybench hold -url http://127.0.0.1:18080/v1/chat/completions?hold -n 1000 [-prompt-bytes 65536]
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: proxybench upstream|goproxy|ttfb|hold [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "upstream":
		err = upstream(os.Args[2:])
	case "goproxy":
		err = goproxy(os.Args[2:])
	case "ttfb":
		err = ttfb(os.Args[2:])
	case "hold":
		err = hold(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "proxybench:", err)
		os.Exit(1)
	}
}

// The fixed answers: a chat completion as vLLM returns it, and a stream of
// sseChunks chunks ending with [DONE].
const (
	model      = "m"
	completion = `{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"m",` +
		`"choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help you today?"},` +
		`"finish_reason":"stop"}],"usage":{"prompt_tokens":20,"completion_tokens":9,"total_tokens":29}}`
	sseChunks = 8
	// RequestBody is what the clients send (scripts/proxybench.sh writes it
	// into wrk's Lua script too).
	requestBody = `{"model":"m","max_tokens":16,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello."}]}`
	streamBody  = `{"model":"m","max_tokens":16,"stream":true,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello."}]}`
)

// vLLM's gauges as llmlb scrapes them: an idle replica.
const metrics = `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0
`

var sseEvents = func() [][]byte {
	var out [][]byte
	words := []string{"Hello", "!", " How", " can", " I", " help", " you", " today?"}
	for i := range sseChunks {
		out = append(out, fmt.Appendf(nil, `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"m",`+
			`"choices":[{"index":0,"delta":{"content":%q},"finish_reason":null}]}`+"\n\n", words[i%len(words)]))
	}
	return append(out, []byte("data: [DONE]\n\n"))
}()

// upstream serves the fixed answers. POST /v1/chat/completions answers the
// JSON completion, or the SSE stream when the body says "stream":true; with
// ?hold it sends the first chunk and holds the stream open until the client
// goes away.
func upstream(args []string) error {
	fs := flag.NewFlagSet("upstream", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:18100", "listen `ADDR`")
	_ = fs.Parse(args)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		io.WriteString(w, metrics)
	})
	mux.HandleFunc("GET /health", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model","owned_by":"proxybench"}]}`)
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !bytes.Contains(body, []byte(`"stream":true`)) {
			h := w.Header()
			h["Content-Type"] = []string{"application/json"}
			h["Content-Length"] = []string{fmt.Sprint(len(completion))}
			io.WriteString(w, completion)
			return
		}
		w.Header()["Content-Type"] = []string{"text/event-stream"}
		w.Header()["Cache-Control"] = []string{"no-cache"}
		f := w.(http.Flusher)
		if r.URL.Query().Has("hold") {
			w.Write(sseEvents[0])
			f.Flush()
			<-r.Context().Done()
			return
		}
		for _, ev := range sseEvents {
			w.Write(ev)
			f.Flush()
		}
	})
	return serve(*listen, mux)
}

// goproxy is the floor reference: httputil.ReverseProxy with Rewrite
// pointing every request at the upstream, over an http.Transport keeping
// connections alive (as many idle per host as llmlb keeps), and a pool of
// copy buffers (ReverseProxy would otherwise allocate 32 KiB a response).
// No parsing, routing, metrics or logs: what llmlb costs beyond it is
// llmlb's own; what it costs beyond NGINX is net/http's.
func goproxy(args []string) error {
	fs := flag.NewFlagSet("goproxy", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:18104", "listen `ADDR`")
	upstream := fs.String("upstream", "http://127.0.0.1:18100", "upstream `URL`")
	_ = fs.Parse(args)
	target, err := url.Parse(*upstream)
	if err != nil {
		return err
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        1024,
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		},
		BufferPool: &bufferPool{},
		ErrorLog:   log.New(io.Discard, "", 0), // the hold clients' cancels
	}
	// Full duplex: otherwise the server discards the rest of the request
	// body when the answer's headers are flushed (an SSE answer's are at
	// once) while the transport may still be sending it, and the upstream
	// connection is closed mid-answer ("use of closed network connection").
	// llmlb does not meet this: it reads the body whole before proxying.
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).EnableFullDuplex()
		rp.ServeHTTP(w, r)
	})
	return serve(*listen, h)
}

// serve serves h on addr until SIGINT or SIGTERM.
func serve(addr string, h http.Handler) error {
	srv := &http.Server{Addr: addr, Handler: h}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// bufferPool recycles goproxy's copy buffers (httputil.BufferPool).
type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, 32<<10)
}

func (b *bufferPool) Put(buf []byte) { b.p.Put(&buf) }

// newClient is a keep-alive HTTP/1.1 client (as wrk's connections are).
func newClient(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns, DisableCompression: true,
		DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
	}}
}

// ttfb sends n streaming requests one after another on one connection and
// prints the median and p90 time from sending to the first body chunk, in
// microseconds: "ttfb_p50_us=... ttfb_p90_us=...".
func ttfb(args []string) error {
	fs := flag.NewFlagSet("ttfb", flag.ExitOnError)
	url := fs.String("url", "", "chat completions `URL`")
	n := fs.Int("n", 2000, "requests")
	_ = fs.Parse(args)
	c := newClient(1)
	var d []time.Duration
	buf := make([]byte, 64<<10)
	for i := range *n + 50 {
		req, _ := http.NewRequest(http.MethodPost, *url, strings.NewReader(streamBody))
		req.Header.Set("Content-Type", "application/json")
		t0 := time.Now()
		res, err := c.Do(req)
		if err != nil {
			return err
		}
		if res.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", res.StatusCode)
		}
		if _, err := res.Body.Read(buf); err != nil && err != io.EOF {
			return err
		}
		first := time.Since(t0)
		_, _ = io.CopyBuffer(io.Discard, res.Body, buf)
		res.Body.Close()
		if i >= 50 { // warm-up
			d = append(d, first)
		}
	}
	slices.Sort(d)
	fmt.Printf("ttfb_p50_us=%.1f ttfb_p90_us=%.1f\n",
		float64(d[len(d)/2].Nanoseconds())/1e3, float64(d[len(d)*9/10].Nanoseconds())/1e3)
	return nil
}

// hold opens n streams (n connections), waits until each has its first
// chunk, prints "held N" and keeps them open until SIGTERM or SIGINT.
func hold(args []string) error {
	fs := flag.NewFlagSet("hold", flag.ExitOnError)
	url := fs.String("url", "", "chat completions `URL` (with ?hold)")
	n := fs.Int("n", 1000, "streams")
	promptBytes := fs.Int("prompt-bytes", 0, "a user message of `N` bytes in each request (an agent's prompt); 0: the short chat")
	_ = fs.Parse(args)
	body := streamBody
	if *promptBytes > 0 {
		body = `{"model":"m","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"` +
			strings.Repeat("x", *promptBytes) + `"}]}`
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	c := newClient(*n)
	var wg sync.WaitGroup
	errs := make(chan error, *n)
	ready := make(chan struct{}, *n)
	for range *n {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, *url, strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			res, err := c.Do(req)
			if err != nil {
				errs <- err
				return
			}
			defer res.Body.Close()
			if _, err := bufio.NewReader(res.Body).ReadSlice('\n'); err != nil {
				errs <- err
				return
			}
			ready <- struct{}{}
			_, _ = io.Copy(io.Discard, res.Body) // until cancelled
		})
	}
	for range *n {
		select {
		case err := <-errs:
			return err
		case <-ready:
		case <-ctx.Done():
			return nil
		}
	}
	fmt.Printf("held %d\n", *n)
	<-ctx.Done()
	wg.Wait()
	return nil
}
