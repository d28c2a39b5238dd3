// Package kvtransport carries the pods' KV-event streams over ZeroMQ (cgo
// libzmq): a Subscriber connects to one pod's PUB socket, a Bus binds one
// SUB socket per data-parallel rank for every publisher that connects and
// follows each topic as its own stream. It owns what is socket-level: the
// sockets and their monitors, redialling, ZMQ_MAXMSGSIZE, the bus's ZeroMQ
// context and ZAP handler naming each connection, the Peer-Address a
// message came from and the checks on it (a topic only from its pod's
// address, one owning connection), and the pod's replay socket
// (ReplaySocket, ReplayRange).
//
// What a stream's messages mean is kvindex's: each stream is a
// kvindex.Sequencer, on which the receiver queues the three-frame messages
// it frames and which replays through the ReplayFunc this package
// supplies. The event plane (package eventplane) composes the two.
package kvtransport
