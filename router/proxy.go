package router

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"

	"github.com/prefixrouter/prefixrouter/health"
)

// Hop-by-hop headers (RFC 9110 section 7.6.1) never cross the proxy.
var hopHeaders = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
	"Proxy-Connection": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
}

// hopByHop reports whether a header (canonical key) is hop-by-hop: one of
// RFC 9110's, or one the message's Connection header lists.
func hopByHop(key, conn string) bool {
	return hopHeaders[key] || (conn != "" && connectionListed(conn, key))
}

// notForwarded reports whether a client's header stays at the router: the
// hop-by-hop ones and those the router sets itself.
func notForwarded(key, conn string) bool {
	switch key {
	case "Host", "Content-Length", "X-Request-Id", "X-Data-Parallel-Rank":
		return true
	}
	return hopByHop(key, conn)
}

func connectionListed(conn, key string) bool {
	for f := range strings.SplitSeq(conn, ",") {
		if strings.EqualFold(strings.TrimSpace(f), key) {
			return true
		}
	}
	return false
}

// copyResponseHeaders copies the pod's end-to-end headers to the client.
func copyResponseHeaders(dst, src *fasthttp.ResponseHeader) {
	conn := string(src.Peek("Connection"))
	for k, v := range src.All() {
		key := string(k)
		if key == "Content-Length" || key == "X-Request-Id" || hopByHop(key, conn) {
			continue
		}
		dst.AddBytesKV(k, v)
	}
}

// upstreamRequest is the request to one target.
func upstreamRequest(t *health.Target, path string, body []byte, in *fasthttp.RequestCtx, id string) *upRequest {
	method := fasthttp.MethodPost
	if in.IsGet() {
		method = fasthttp.MethodGet
	}
	rq := &upRequest{method: method, endpoint: t.ID.Endpoint, path: path, body: body,
		in: &in.Request.Header, clientIP: in.RemoteIP(), id: id}
	if t.Spec.DP > 1 {
		rq.dpRank = strconv.Itoa(t.ID.Rank)
	}
	return rq
}

func statusLabel(status int) string {
	switch {
	case status >= 500:
		return "upstream_error"
	case status >= 400:
		return "client_error"
	}
	return "ok"
}

// readSome reads until at least one byte or an error.
func readSome(r io.Reader, buf []byte) (int, error) {
	for {
		n, err := r.Read(buf)
		if n > 0 || err != nil {
			return n, err
		}
	}
}

// readAllLimit reads the rest of r after the bytes already in first.
func readAllLimit(r io.Reader, first []byte, limit int64) ([]byte, error) {
	out := make([]byte, len(first), max(len(first)*2, 4096))
	copy(out, first)
	for {
		if int64(len(out)) > limit {
			return nil, fmt.Errorf("response larger than %d bytes", limit)
		}
		if len(out) == cap(out) {
			out = append(out, 0)[:len(out)]
		}
		n, err := r.Read(out[len(out):cap(out)])
		out = out[:len(out)+n]
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// sseErrorFirst reports whether a stream's first bytes are an SSE event
// carrying a top-level "error" object, as vLLM sends when a streamed
// request fails before its first token.
func sseErrorFirst(b []byte) bool {
	b = bytes.TrimLeft(b, " \r\n")
	rest, ok := bytes.CutPrefix(b, []byte("data:"))
	if !ok {
		return false
	}
	line, _, _ := bytes.Cut(rest, []byte("\n"))
	line = bytes.TrimSpace(line)
	if len(line) == 0 || line[0] != '{' {
		return false
	}
	p := parserPool.Get()
	defer parserPool.Put(p)
	v, err := p.ParseBytes(line)
	if err != nil {
		return false
	}
	e := v.Get("error")
	return e != nil && e.Type() == fastjson.TypeObject && v.Get("choices") == nil
}
