package router

import (
	"encoding/json"
	"strconv"

	"github.com/valyala/fasthttp"
)

// apiError is an OpenAI-shaped error: {"error": {"message", "type", "param",
// "code"}} with the HTTP status that goes with it.
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
