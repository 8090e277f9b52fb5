// Package openai is llmlb's one description of the OpenAI wire format, as
// vLLM and the other OpenAI-compatible servers speak it: the error body
// and its types and codes, the /v1/models list, the usage object and the
// reading of it out of a response (an SSE stream's chunks or a JSON body),
// the data lines of an event stream, and the API paths whose shape the
// balancer relies on. The proxy, the ext_proc picker, the observer of
// responses, the admin API and the simulated replica all read and write
// the format through it, so that they cannot drift apart.
package openai
