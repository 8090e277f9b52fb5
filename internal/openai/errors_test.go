package openai

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestErrorJSON(t *testing.T) {
	cases := []struct {
		name, typ, code, msg, want string
	}{
		{"plain", TypeInvalidRequest, CodeNotFound, "unknown path /x",
			`{"error":{"message":"unknown path /x","type":"invalid_request_error","code":"not_found"}}` + "\n"},
		{"escaped", TypeServer, CodeInternal, `a "quoted" <tag>`,
			`{"error":{"message":"a \"quoted\" \u003ctag\u003e","type":"server_error","code":"internal_error"}}` + "\n"},
		{"empty message", TypeUnavailable, CodeNoHealthyInstances, "",
			`{"error":{"message":"","type":"service_unavailable_error","code":"no_healthy_instances"}}` + "\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := string(ErrorJSON(c.typ, c.code, c.msg)); got != c.want {
				t.Errorf("ErrorJSON = %s, want %s", got, c.want)
			}
		})
	}
}

func TestWriteError(t *testing.T) {
	cases := []struct {
		name           string
		status         int
		typ, code, msg string
		wantBody       string
	}{
		{"timeout", http.StatusGatewayTimeout, TypeTimeout, CodeUpstreamTimeout, "replica a did not answer in time",
			`{"error":{"message":"replica a did not answer in time","type":"timeout_error","code":"upstream_timeout"}}` + "\n"},
		{"too large", http.StatusRequestEntityTooLarge, TypeInvalidRequest, CodeTooLarge, "too big",
			`{"error":{"message":"too big","type":"invalid_request_error","code":"request_too_large"}}` + "\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			w.Header().Set("Content-Length", "999") // a replica's, to be dropped
			WriteError(w, c.status, c.typ, c.code, c.msg)
			if w.Code != c.status || w.Body.String() != c.wantBody {
				t.Errorf("got %d %s, want %d %s", w.Code, w.Body, c.status, c.wantBody)
			}
			if ct := w.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			if cl, ok := w.Header()["Content-Length"]; ok {
				t.Errorf("Content-Length %q kept", cl)
			}
		})
	}
}

func TestWriteStatusError(t *testing.T) {
	cases := []struct {
		status   int
		wantBody string
	}{
		{http.StatusNotFound, `{"error":{"message":"m","type":"invalid_request_error","code":"not_found"}}` + "\n"},
		{http.StatusBadRequest, `{"error":{"message":"m","type":"invalid_request_error","code":"bad_request"}}` + "\n"},
		{http.StatusUnauthorized, `{"error":{"message":"m","type":"invalid_request_error","code":"unauthorized"}}` + "\n"},
		{http.StatusInternalServerError, `{"error":{"message":"m","type":"server_error","code":"internal_server_error"}}` + "\n"},
		{http.StatusServiceUnavailable, `{"error":{"message":"m","type":"server_error","code":"service_unavailable"}}` + "\n"},
	}
	for _, c := range cases {
		w := httptest.NewRecorder()
		WriteStatusError(w, c.status, "m")
		if w.Code != c.status || w.Body.String() != c.wantBody {
			t.Errorf("%d: got %d %s, want %s", c.status, w.Code, w.Body, c.wantBody)
		}
	}
}

func TestErrorEvent(t *testing.T) {
	got := string(ErrorEvent(TypeServer, CodeStreamBroken, "the stream from replica a broke before it ended"))
	want := `data: {"error":{"message":"the stream from replica a broke before it ended","type":"server_error","code":"upstream_stream_broken"}}` + "\n\n"
	if got != want {
		t.Errorf("ErrorEvent = %q, want %q", got, want)
	}
}

func TestModelNotFound(t *testing.T) {
	a := ModelNotFound(`we"ird`)
	want := Answer{Status: http.StatusNotFound, Type: TypeInvalidRequest, Code: CodeModelNotFound,
		Message: `the model "we\"ird" does not exist on any replica`}
	if a != want {
		t.Errorf("ModelNotFound = %+v, want %+v", a, want)
	}
}

func TestReplicaError(t *testing.T) {
	cases := []struct {
		status int
		want   string
	}{
		{http.StatusBadRequest, "BadRequestError"},
		{http.StatusNotFound, "NotFoundError"},
		{http.StatusRequestEntityTooLarge, "RequestEntityTooLarge"},
		{http.StatusServiceUnavailable, "ServiceUnavailableError"},
		{http.StatusInternalServerError, "InternalServerError"},
		{http.StatusBadGateway, "InternalServerError"},
		{http.StatusTooManyRequests, "BadRequestError"},
	}
	for _, c := range cases {
		if got := ReplicaErrorType(c.status); got != c.want {
			t.Errorf("ReplicaErrorType(%d) = %q, want %q", c.status, got, c.want)
		}
	}
	got := string(jsonLine(NewReplicaError(http.StatusNotFound, "no such model")))
	want := `{"error":{"message":"no such model","type":"NotFoundError","param":null,"code":404}}` + "\n"
	if got != want {
		t.Errorf("NewReplicaError encodes as %s, want %s", got, want)
	}
}

func TestRetryAfter(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "1", -time.Second: "1", time.Millisecond: "1", time.Second: "1",
		1001 * time.Millisecond: "2", 59*time.Second + time.Nanosecond: "60", time.Hour: "3600",
	} {
		if got := RetryAfter(d); got != want {
			t.Errorf("RetryAfter(%v) = %s, want %s", d, got, want)
		}
	}
}

func TestRefusal(t *testing.T) {
	for _, code := range []string{CodeQueueFull, CodeShed, CodeTenantLimit, CodeQueueTimeout} {
		a := Refusal(code)
		if a.Status != 429 || a.Type != TypeRateLimit || a.Code != code || a.Message == "" {
			t.Errorf("Refusal(%s) = %+v", code, a)
		}
	}
	if a := ShuttingDown(); a.Status != 503 || a.Code != CodeShuttingDown {
		t.Errorf("ShuttingDown() = %+v", a)
	}
}
