// Package tokenize owns turning OpenAI requests into the exact token ids a
// vLLM pod computes for them: a pure-Go tokenizer.json encoder (sub-package
// bpe), chat-template rendering (sub-package chat), a per-model registry with
// local / remote / auto modes, tokenizer files from the Hugging Face Hub
// (sub-package hub), the remote render client, a segment cache and the
// built-in "bytes" model. It knows nothing about routing: a remote call
// takes the base URL of the pod the caller picked.
//
// # API contract (stable; router and sim depend on it)
//
//	reg := tokenize.NewRegistry(tokenize.Options{Registerer: promReg, Logger: log, Hub: hubClient})
//	m, err := reg.AddSpec("qwen3:auto=/models/qwen3")   // --tokenizer flag value (mode local unless named)
//	spec, err := tokenize.ParseSpec("Qwen/Qwen3-8B")     // the same, parsed; the caller may set spec.Mode
//	m, err := reg.Load(ctx, spec)                        // fetches a hub repository's files first
//	m, err := reg.Add("demo", "bytes", tokenize.ModeLocal) // built-in bytes model
//	m, err := reg.Model("qwen3")                         // ErrUnknownModel if absent
//
//	ids, err := m.Encode(text, addSpecialTokens)          // local only
//	text, err := m.Decode(ids, skipSpecialTokens)         // for /detokenize
//	prompt, err := m.RenderChat(req)                      // local template render
//	prompt, ids, err := m.EncodeChat(req)                 // render + encode(add_special_tokens=false)
//
//	// Mode-aware entry points for the router: local, remote or auto per model.
//	res, err := m.TokenizeChat(ctx, req, "http://pod:8000")
//	res, err := m.TokenizePrompt(ctx, prompt, true, "http://pod:8000")
//	m.NeedsBaseURL(chat) // true when the call may contact the pod: pass a URL
//
//	// Local models also stream: ids a segment (the text between special
//	// tokens) at a time, for a caller that may need only a prefix.
//	st, err := m.StreamChat(req, "http://pod:8000") // ErrNotLocal when the pod tokenizes
//	err = st.Step(); ids := st.IDs(); st.Done(); st.EstimateCount(); st.Prefetch()
//	ids, err = st.Finish()                          // the rest; records metrics, auto comparison
//
//	b := tokenize.Bytes() // the built-in model without a registry (local only)
//
// A spec (SpecForms) is MODEL=SOURCE or MODEL:MODE=SOURCE, or a bare
// MODEL[:MODE]. SOURCE is a model directory (tokenizer.json, optional
// tokenizer_config.json and chat_template.jinja), a tokenizer.json file,
// hf:ORG/NAME[@REVISION] for a Hugging Face Hub repository, the word "bytes"
// for the built-in model, or empty for a remote-only model. A bare MODEL is
// the local path MODEL when one exists, else the hub repository MODEL
// (optionally hf:MODEL and MODEL@REVISION), served under the repository's
// name. MODE is local (default), remote or auto. A directory gets
// transformers' semantics (add_bos_token/add_eos_token from
// tokenizer_config.json decide BOS/EOS, as vLLM sees them); a lone
// tokenizer.json gets HF tokenizers' own, and no chat template.
//
// A hub repository's tokenizer.json, tokenizer_config.json and
// chat_template.jinja are fetched by sub-package hub into the
// huggingface_hub cache (its environment variables, its layout, offline
// mode) and loaded from the snapshot directory like a model directory.
// Mode remote fetches nothing. When the fetch or the load fails, mode local
// fails; mode auto serves the model remote with a warning naming the reason
// and counts it (_remote_switches_total, reason hub_unavailable).
//
// Errors: *TemplateError when a chat template raises (the request is bad for
// this model, as vLLM answers 400); *RemoteError for a non-2xx pod answer;
// ErrUnknownModel, ErrNoLocal (remote-only model), ErrNoTemplate (no local
// template: the model's chat requests go to the pod in remote/auto mode, and
// a template that fails to compile is logged and counted at Add).
//
// Metrics (on Options.Registerer; labels model, mode, reason only):
// prefixrouter_tokenize_requests_total, _errors_total, _seconds,
// _remote_switches_total, _comparisons_total, _mode,
// prefixrouter_tokenize_segment_cache_{hits,misses}_total and
// prefixrouter_tokenize_message_cache_{hits,misses}_total.
//
// Caches (shared by all models of a registry; neither changes a result):
// the segment cache (Options.CacheMaxBytes) holds the ids of text between
// added tokens; the message cache (Options.MessageCacheMaxBytes) holds
// decoded chat messages and tool definitions by the seeded hash of their raw
// JSON, so turn N of a conversation decodes only its new messages. Template
// values are immutable, so renders share cached messages safely; the
// template still renders every message of every request, so the cache
// cannot make a render depend on anything but that request.
//
// Parity: the encoder matches HF tokenizers exactly on the shared corpus
// (bpe.TestParity) — the one known residual class is code points new in
// Unicode 16, which Go's 15.0 tables leave unassigned (bpe.TestKnownEdgeCases).
// Builds with -tags hftokenizers encode tokenizer.json models with
// HuggingFace's Rust library through github.com/daulet/tokenizers instead
// (libtokenizers.a must be on the linker path); everything else is unchanged.
//
// ChatRequest carries messages, tools and chat_template_kwargs as raw JSON so
// that key order survives to the template (tools | tojson depends on it).
// AddGenerationPrompt has no implicit default: vLLM's default is true, so
// request parsers must set it when the request omits it.
//
// # The bytes model
//
// One token per UTF-8 byte (id = byte value) plus four special tokens:
// 256 <|bos|>, 257 <|eos|>, 258 <|im_start|>, 259 <|im_end|>. Encode with
// addSpecialTokens=true prepends <|bos|>. Special-token names in the text
// encode as their special ids. The chat format is
//
//	[<|im_start|>tools\n{tools as JSON}<|im_end|>\n]
//	<|im_start|>{role}\n{content}[\n{tool_calls as JSON}]<|im_end|>\n   (per message)
//	[<|im_start|>assistant\n]                                        (add_generation_prompt)
//
// where content is the string, the concatenated "text" of content parts, or
// empty for null; continue_final_message leaves the last message open (no
// <|im_end|>\n).
//
// # Remote protocol
//
// Chat: POST {base}/v1/chat/completions/render with the request's own body
// when ChatRequest.Body is set, else {"model", "messages", "tools",
// "chat_template_kwargs", "add_generation_prompt", "continue_final_message"}.
// Prompts: POST {base}/v1/completions/render with {"model", "prompt",
// "add_special_tokens"}. When a render endpoint answers 404 or 405 the client
// falls back to POST {base}/tokenize with those fields (never the whole
// client body). Token ids are read
// from "token_ids", "prompt_token_ids" or "tokens" of the response object (or
// of its first element when the response is an array); a rendered prompt is
// read from "prompt" or "prompt_text" when present.
package tokenize
