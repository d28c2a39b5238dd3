package router

// Endpoint is an API path the router sends to a pod: one it routes by its
// policy, reading the prompt (completions, chat, responses), or one it
// forwards to the least loaded pod of the body's model.
type Endpoint uint8

// Endpoints.
const (
	EndpointCompletions Endpoint = iota + 1
	EndpointChat
	// EndpointResponses is OpenAI's Responses API, which vLLM renders
	// through the chat template: routed like chat where the router can
	// derive the same messages (responses.go), on load otherwise.
	EndpointResponses
	EndpointEmbeddings
	EndpointPooling
	EndpointClassify
	EndpointScore
	EndpointRerank
	EndpointTokenize
	EndpointDetokenize
	EndpointVersion
)

var endpointNames = [...]string{
	EndpointCompletions: "completions", EndpointChat: "chat", EndpointResponses: "responses",
	EndpointEmbeddings: "embeddings", EndpointPooling: "pooling", EndpointClassify: "classify",
	EndpointScore: "score", EndpointRerank: "rerank", EndpointTokenize: "tokenize",
	EndpointDetokenize: "detokenize", EndpointVersion: "version",
}

func (e Endpoint) String() string {
	if int(e) < len(endpointNames) && endpointNames[e] != "" {
		return endpointNames[e]
	}
	return "unknown"
}

// Path is the endpoint's canonical path (apiPaths lists its aliases).
func (e Endpoint) Path() string {
	switch e {
	case EndpointCompletions:
		return "/v1/completions"
	case EndpointChat:
		return "/v1/chat/completions"
	case EndpointResponses:
		return "/v1/responses"
	case EndpointEmbeddings:
		return "/v1/embeddings"
	}
	return "/" + e.String()
}

// routed reports whether the router's policy decides the endpoint's
// target from its prompt; the others go to the least loaded pod.
func (e Endpoint) routed() bool {
	return e == EndpointCompletions || e == EndpointChat || e == EndpointResponses
}

// rendersChat reports whether the pod renders the request through the
// model's chat template.
func (e Endpoint) rendersChat() bool { return e == EndpointChat || e == EndpointResponses }

// method is the HTTP method the endpoint answers.
func (e Endpoint) method() string {
	if e == EndpointVersion {
		return "GET"
	}
	return "POST"
}

// modelRequired reports whether a body without "model" is refused. vLLM
// takes a missing model on its other endpoints as its only model, which
// the router does when the fleet serves one (Router.defaultModel).
func (e Endpoint) modelRequired() bool { return e == EndpointCompletions || e == EndpointChat }

// apiPath is one path of the API listener that reaches a pod. path is the
// key itself, kept so that an exchange holds it without a copy.
type apiPath struct {
	ep   Endpoint
	path string
}

// apiPaths are the paths the API listener sends to pods, each forwarded
// as the client named it: vLLM serves the aliases of score and rerank too.
var apiPaths = func() map[string]apiPath {
	m := map[string]apiPath{}
	for _, p := range []struct {
		ep    Endpoint
		paths []string
	}{
		{EndpointCompletions, []string{"/v1/completions"}},
		{EndpointChat, []string{"/v1/chat/completions"}},
		{EndpointResponses, []string{"/v1/responses"}},
		{EndpointEmbeddings, []string{"/v1/embeddings"}},
		{EndpointPooling, []string{"/pooling"}},
		{EndpointClassify, []string{"/classify"}},
		{EndpointScore, []string{"/score", "/v1/score"}},
		{EndpointRerank, []string{"/rerank", "/v1/rerank", "/v2/rerank"}},
		{EndpointTokenize, []string{"/tokenize"}},
		{EndpointDetokenize, []string{"/detokenize"}},
		{EndpointVersion, []string{"/version"}},
	} {
		for _, path := range p.paths {
			m[path] = apiPath{ep: p.ep, path: path}
		}
	}
	return m
}()
