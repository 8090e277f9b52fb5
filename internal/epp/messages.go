package epp

import (
	"errors"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/openai"
	"github.com/llmlb/llmlb/internal/proxy"
)

// destination sets the endpoint header, overwriting one the client may
// have sent: the gateway takes the first valid endpoint it finds, so an
// appended value would let a client choose its pod.
func destination(ep string) *extprocv3.HeaderMutation {
	return &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
		Header:       &corev3.HeaderValue{Key: HeaderDestination, RawValue: []byte(ep)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}}}
}

// destinationMetadata is {"envoy.lb": {"x-gateway-destination-endpoint": ep}}.
func destinationMetadata(ep string) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		MetadataNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			MetadataDestination: structpb.NewStringValue(ep),
		}}),
	}}
}

// routeHeaders are serve's X-LLMLB-Replica and X-LLMLB-Route on the response.
func routeHeaders(res *balancer.Reservation) *extprocv3.HeaderMutation {
	return &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
		{Header: &corev3.HeaderValue{Key: strings.ToLower(proxy.HeaderReplica), RawValue: []byte(res.Replica)},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD},
		{Header: &corev3.HeaderValue{Key: strings.ToLower(proxy.HeaderRoute), RawValue: []byte(res.Reason)},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD},
	}}
}

func headersResponse(mut *extprocv3.HeaderMutation, md *structpb.Struct) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{HeaderMutation: mut},
		}},
		DynamicMetadata: md,
	}
}

func responseHeadersResponse(mut *extprocv3.HeaderMutation) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{HeaderMutation: mut},
		}},
	}
}

// requestBodyResponse answers a BUFFERED body: the body unchanged, the
// endpoint header added to the request still held by the gateway.
func requestBodyResponse(mut *extprocv3.HeaderMutation, md *structpb.Struct) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
			Response: &extprocv3.CommonResponse{HeaderMutation: mut},
		}},
		DynamicMetadata: md,
	}
}

// streamedBody returns body as FULL_DUPLEX_STREAMED body answers of at most
// bodyChunk bytes; the last carries end_of_stream when eos (request side:
// request is true).
func streamedBody(body []byte, eos, request bool) []*extprocv3.ProcessingResponse {
	var out []*extprocv3.ProcessingResponse
	for {
		n := min(len(body), bodyChunk)
		last := n == len(body)
		out = append(out, bodyResponse(request, &extprocv3.CommonResponse{
			BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
				StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body[:n], EndOfStream: eos && last},
			}},
		}))
		body = body[n:]
		if last {
			return out
		}
	}
}

func bodyResponse(request bool, c *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
			RequestBody: &extprocv3.BodyResponse{Response: c}}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
		ResponseBody: &extprocv3.BodyResponse{Response: c}}}
}

// requestBodyPassthrough answers a request body chunk the picker does not
// change: echoed in FULL_DUPLEX_STREAMED (the gateway forwards only what
// comes back), an empty answer (unchanged) otherwise.
func requestBodyPassthrough(mode filterv3.ProcessingMode_BodySendMode, b *extprocv3.HttpBody) *extprocv3.ProcessingResponse {
	if mode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		return streamedBody(b.GetBody(), b.GetEndOfStream(), true)[0]
	}
	return bodyResponse(true, &extprocv3.CommonResponse{})
}

// responseBodyPassthrough is requestBodyPassthrough for the response. A
// chunk is answered as it comes, never held: streams reach the client
// token by token.
func responseBodyPassthrough(mode filterv3.ProcessingMode_BodySendMode, b *extprocv3.HttpBody) *extprocv3.ProcessingResponse {
	if mode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		// The gateway's chunks are at most its buffer; keep one answer per chunk.
		return bodyResponse(false, &extprocv3.CommonResponse{
			BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
				StreamedResponse: &extprocv3.StreamedBodyResponse{Body: b.GetBody(), EndOfStream: b.GetEndOfStream()},
			}},
		})
	}
	return bodyResponse(false, &extprocv3.CommonResponse{})
}

func trailersResponse(request bool) *extprocv3.ProcessingResponse {
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
			RequestTrailers: &extprocv3.TrailersResponse{}}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
		ResponseTrailers: &extprocv3.TrailersResponse{}}}
}

// immediateError is the gateway's answer to the client instead of
// routing, in OpenAI's error shape.
func immediateError(code int, typ, errCode, msg string) *extprocv3.ProcessingResponse {
	return immediateJSON(code, openai.ErrorJSON(typ, errCode, msg))
}

// immediateRefusal is flow control's answer: 429 in OpenAI's error shape
// with Retry-After.
func immediateRefusal(a openai.Answer, retryAfter time.Duration) *extprocv3.ProcessingResponse {
	return immediateJSON(a.Status, openai.ErrorJSON(a.Type, a.Code, a.Message),
		&corev3.HeaderValue{Key: "retry-after", RawValue: []byte(openai.RetryAfter(retryAfter))})
}

func immediateJSON(code int, body []byte, extra ...*corev3.HeaderValue) *extprocv3.ProcessingResponse {
	headers := []*corev3.HeaderValueOption{{
		Header:       &corev3.HeaderValue{Key: "content-type", RawValue: []byte("application/json")},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}}
	for _, h := range extra {
		headers = append(headers, &corev3.HeaderValueOption{Header: h, AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD})
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(code)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: headers},
			Body:    body,
			Details: http.StatusText(code),
		},
	}}
}

// parseSubset reads the subset hint: a list of "ip:port" strings (one
// string with commas is accepted too). Entries that are not host:port are
// ignored; an empty result is an empty subset, which admits nothing.
func parseSubset(v *structpb.Value) map[string]bool {
	out := map[string]bool{}
	add := func(s string) {
		for part := range strings.SplitSeq(s, ",") {
			if ep, err := canonical(strings.TrimSpace(part)); err == nil {
				out[ep] = true
			}
		}
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_ListValue:
		for _, e := range k.ListValue.GetValues() {
			add(e.GetStringValue())
		}
	case *structpb.Value_StringValue:
		add(k.StringValue)
	}
	return out
}

// canonical normalises "ip:port" (IPv6 in brackets, as net.JoinHostPort).
func canonical(hp string) (string, error) {
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return "", err
	}
	if host == "" || port == "" {
		return "", errors.New("epp: empty host or port")
	}
	if ip := net.ParseIP(host); ip != nil {
		host = ip.String()
	}
	return net.JoinHostPort(host, port), nil
}

// hostPort is a replica URL's "host:port" (the scheme's default port when
// none is given), the form the gateway routes to.
func hostPort(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	if u.Host == "" {
		return "", errors.New("epp: replica url has no host")
	}
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	return canonical(net.JoinHostPort(u.Hostname(), port))
}
