package peers

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"

	zmq "github.com/pebbe/zmq4"

	"github.com/prefixrouter/prefixrouter/internal/zmqwait"
)

// The ZAP handler. libzmq asks it, on inproc://zeromq.zap.01 of the
// socket's context, whether a client may finish its handshake with a
// socket that has a ZAP domain: here, a mesh's CURVE PUB socket. Without
// it a CURVE server admits any client that knows its public key; with it,
// only clients that prove they hold the deployment's keypair.
//
// The endpoint belongs to the process's one ZeroMQ context, so the
// handler is one per process and this file alone owns it (nothing else in
// the binary may bind the endpoint or call zmq.AuthStart). The first mesh
// that listens with a key starts it, and it lives as long as the process:
// closing the endpoint and binding it again races with libzmq's reaper,
// and an idle handler costs one goroutine parked in Go's poller. Each mesh
// admits its own key on a domain of its own, so that several meshes in one
// process (tests run replicas side by side) with different keys never
// admit each other's clients; it withdraws the domain when its PUB socket
// closes, after which the domain admits no one.

const zapEndpoint = "inproc://zeromq.zap.01"

// zapDomain is what one mesh's PUB socket admits.
type zapDomain struct {
	name string
	key  string // the raw 32 bytes of the admitted public key
	// onDeny hears of each handshake refused (the mesh counts and logs
	// them), on the handler's goroutine.
	onDeny func(address string)
}

var zapState struct {
	mu      sync.Mutex
	started bool
	err     error
	next    uint64
	domains map[string]*zapDomain
}

// zapAdmit starts the handler if it does not run yet and returns a new
// domain that admits the clients holding pub (Z85); release withdraws it.
func zapAdmit(pub string, onDeny func(address string)) (domain string, release func(), err error) {
	raw := zmq.Z85decode(pub)
	zapState.mu.Lock()
	defer zapState.mu.Unlock()
	if !zapState.started {
		zapState.started = true
		zapState.err = zapStart()
	}
	if zapState.err != nil {
		return "", nil, fmt.Errorf("ZAP handler: %w", zapState.err)
	}
	if zapState.domains == nil {
		zapState.domains = map[string]*zapDomain{}
	}
	zapState.next++
	d := &zapDomain{name: "prefixrouter-peers-" + strconv.FormatUint(zapState.next, 10), key: raw, onDeny: onDeny}
	zapState.domains[d.name] = d
	return d.name, func() {
		zapState.mu.Lock()
		defer zapState.mu.Unlock()
		delete(zapState.domains, d.name)
	}, nil
}

// zapStart binds the endpoint and starts the handler's goroutine.
func zapStart() error {
	sock, err := zmq.NewSocket(zmq.REP)
	if err != nil {
		return err
	}
	_ = sock.SetLinger(0)
	if err := sock.Bind(zapEndpoint); err != nil {
		sock.Close()
		return fmt.Errorf("bind %s: %w", zapEndpoint, err)
	}
	w, err := zmqwait.New(sock)
	if err != nil {
		sock.Close()
		return err
	}
	go zapServe(sock, w)
	return nil
}

// zapServe answers every request until the socket fails. A handler that
// stops answering fails closed: libzmq waits for its answer and the
// handshake never completes.
func zapServe(sock *zmq.Socket, w *zmqwait.Waiter) {
	for {
		if _, err := w.Wait(context.Background(), 0); err != nil {
			slog.Error("peer mesh: the ZAP handler stopped: no replica can connect to this one's --peer-listen", "err", err)
			return
		}
		for {
			req, err := sock.RecvMessageBytes(zmq.DONTWAIT)
			if err != nil {
				break
			}
			if _, err := sock.SendMessage(zapAnswer(req)); err != nil {
				slog.Error("peer mesh: the ZAP handler cannot answer", "err", err)
			}
		}
	}
}

// zapAnswer is the reply to one request (ZAP 1.0: version, request id,
// domain, address, routing id, mechanism, credentials...): on a mesh's
// domain, 200 for a CURVE client whose public key it admits and 400
// otherwise; elsewhere 200 in the clear (NULL) and 400 for the rest.
func zapAnswer(req [][]byte) [][]byte {
	reply := func(id []byte, code, text string) [][]byte {
		return [][]byte{[]byte("1.0"), id, []byte(code), []byte(text), nil, nil}
	}
	if len(req) < 6 || string(req[0]) != "1.0" {
		var id []byte
		if len(req) > 1 {
			id = req[1]
		}
		return reply(id, "500", "malformed ZAP request")
	}
	id, address, mechanism := req[1], string(req[3]), string(req[5])
	zapState.mu.Lock()
	d := zapState.domains[string(req[2])]
	zapState.mu.Unlock()
	if d == nil {
		if mechanism == "NULL" {
			// Not a mesh's: the process's other sockets (KV events) are
			// in the clear, and whether libzmq asks for them is its
			// version's business; they keep ZeroMQ's classic answer.
			return reply(id, "200", "OK")
		}
		// A domain withdrawn (its mesh stopped).
		return reply(id, "400", "unknown domain")
	}
	if mechanism == "CURVE" && len(req) == 7 && string(req[6]) == d.key {
		return reply(id, "200", "OK")
	}
	if d.onDeny != nil {
		d.onDeny(address)
	}
	return reply(id, "400", "key not admitted")
}
