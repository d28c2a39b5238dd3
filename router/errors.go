package router

import (
	"bytes"
	"encoding/json"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// apiError is an OpenAI-shaped error: {"error": {"message", "type", "param",
// "code"}} with the HTTP status that goes with it.
//
// What the router says to a client never names a pod: no URL, address,
// KV-event endpoint or target id, in a body or a header (the X-Prefixrouter
// headers of --debug-headers aside, which say they expose them). The
// detail goes to the log and, for upstream failures, to GET /debug/targets
// on the admin listener (failures.go), under the request id the client
// got. A pod's own answers are relayed byte for byte, but for its
// errors: a 5xx is replaced by the router's own error of the same status
// (the pod's text goes to the log) and a 4xx, a validation error the
// client needs, is relayed with the pod's address taken out.
type apiError struct {
	Status  int
	Message string
	Type    string
	Param   string
	Code    string
	// RetryAfter, when positive, is sent as Retry-After (seconds).
	RetryAfter int
}

// Error types, as OpenAI and vLLM spell them.
const (
	typeInvalidRequest = "invalid_request_error"
	typeNotFound       = "NotFoundError"
	typeServer         = "server_error"
	typeUnavailable    = "service_unavailable"
)

func errBadRequest(param, msg string) *apiError {
	if param != "" {
		msg = param + ": " + msg
	}
	return &apiError{Status: fasthttp.StatusBadRequest, Message: msg, Type: typeInvalidRequest, Param: param}
}

func errUnknownModel(model string) *apiError {
	return &apiError{
		Status:  fasthttp.StatusNotFound,
		Message: "The model `" + model + "` does not exist.",
		Type:    typeNotFound, Param: "model", Code: "model_not_found",
	}
}

func errTooLarge(limit int) *apiError {
	return &apiError{
		Status:  fasthttp.StatusRequestEntityTooLarge,
		Message: "request body exceeds the limit of " + strconv.Itoa(limit) + " bytes",
		Type:    typeInvalidRequest, Code: "request_too_large",
	}
}

func errNoTarget(msg string, retryAfter int) *apiError {
	return &apiError{
		Status: fasthttp.StatusServiceUnavailable, Message: msg,
		Type: typeUnavailable, Code: "no_routable_target", RetryAfter: retryAfter,
	}
}

// errOverloaded answers a request the router refuses to protect itself
// (its memory, its body budget): the client may try again shortly.
func errOverloaded(msg string, retryAfter int) *apiError {
	return &apiError{
		Status: fasthttp.StatusServiceUnavailable, Message: msg,
		Type: typeUnavailable, Code: "overloaded", RetryAfter: retryAfter,
	}
}

// errBodyTimeout answers a client that stopped sending its body.
func errBodyTimeout(idle time.Duration) *apiError {
	return &apiError{
		Status:  fasthttp.StatusRequestTimeout,
		Message: "the request body stopped arriving for " + idle.String(),
		Type:    typeInvalidRequest, Code: "request_timeout",
	}
}

func errUpstream(status int, msg string) *apiError {
	return &apiError{Status: status, Message: msg, Type: typeServer, Code: "upstream_error"}
}

type errorBody struct {
	Error errorFields `json:"error"`
}

type errorFields struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func (e *apiError) body() []byte {
	f := errorFields{Message: e.Message, Type: e.Type}
	if e.Param != "" {
		f.Param = &e.Param
	}
	if e.Code != "" {
		f.Code = &e.Code
	}
	b, _ := json.Marshal(errorBody{Error: f})
	return b
}

// write sends the error as the whole response.
func (e *apiError) write(ctx *fasthttp.RequestCtx) {
	ctx.Response.ResetBody()
	ctx.SetStatusCode(e.Status)
	ctx.SetContentType("application/json")
	if e.RetryAfter > 0 {
		ctx.Response.Header.Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	ctx.SetBody(e.body())
}

// scrubAddress takes the pod's address (its base URL, scheme and host,
// host:port and host) out of a pod's answer relayed to a client.
func scrubAddress(body []byte, baseURL string) []byte {
	u, err := url.Parse(baseURL)
	if err != nil || u.Host == "" {
		return body
	}
	for _, addr := range podAddresses(baseURL, u) {
		if bytes.Contains(body, []byte(addr)) {
			body = bytes.ReplaceAll(body, []byte(addr), []byte("[model server]"))
		}
	}
	return body
}

// podAddresses are the spellings of a pod's address a message may carry,
// longest first so that a shorter one never splits a longer one.
func podAddresses(baseURL string, u *url.URL) []string {
	var out []string
	for _, addr := range []string{strings.TrimRight(baseURL, "/"), u.Scheme + "://" + u.Host, u.Host, u.Hostname()} {
		if addr != "" {
			out = append(out, addr)
		}
	}
	return out
}

// podMessage is what a client hears of a pod's error body when the router
// answers in its own words (a render call that rejected the prompt): the
// message of an OpenAI, vLLM or FastAPI error, else the body, with the
// pod's address (its base URL, host:port and host) taken out.
func podMessage(body, baseURL string) string {
	msg := strings.TrimSpace(body)
	var e struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
		Detail  json.RawMessage `json:"detail"`
	}
	if json.Unmarshal([]byte(msg), &e) == nil {
		var inner struct {
			Message string `json:"message"`
		}
		var text string
		switch {
		case json.Unmarshal(e.Error, &inner) == nil && inner.Message != "":
			msg = inner.Message
		case json.Unmarshal(e.Error, &text) == nil && text != "":
			msg = text
		case e.Message != "":
			msg = e.Message
		case json.Unmarshal(e.Detail, &text) == nil && text != "":
			msg = text
		}
	}
	return string(scrubAddress([]byte(msg), baseURL))
}
