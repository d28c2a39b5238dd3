package kvindex

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/prefixrouter/prefixrouter/internal/hostname"
)

// MaxTopicLen bounds a topic frame the bus reads as a pod's identity.
const MaxTopicLen = 1024

// Topic is a KV-event topic of the form deployments give vLLM's publishers
// so that a collector binding one socket tells the pods apart:
// PREFIX@HOST[:PORT]@MODEL, as in llm-d's kv@$(POD_IP):$(POD_PORT)@MODEL.
// HOST:PORT is the pod's HTTP address; every data-parallel rank of a pod
// publishes the same topic (vLLM offsets the port it connects to instead).
type Topic struct {
	Prefix string
	// Host is the pod's host in lower case, without brackets.
	Host string
	// Port is the pod's HTTP port; 0 when the topic names none.
	Port  int
	Model string
}

// ParseTopic reads a topic in the PREFIX@HOST[:PORT]@MODEL form. The model
// is everything after the second '@' and may be empty; an IPv6 host with a
// port is bracketed ([fd00::7]:8000).
func ParseTopic(s string) (Topic, error) {
	if len(s) > MaxTopicLen {
		return Topic{}, fmt.Errorf("topic longer than %d bytes", MaxTopicLen)
	}
	if !utf8.ValidString(s) || strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return Topic{}, errors.New("topic is not printable UTF-8")
	}
	prefix, rest, ok := strings.Cut(s, "@")
	if !ok {
		return Topic{}, errors.New("topic has no '@' (want PREFIX@HOST[:PORT]@MODEL)")
	}
	pod, model, ok := strings.Cut(rest, "@")
	if !ok {
		return Topic{}, errors.New("topic has one '@' (want PREFIX@HOST[:PORT]@MODEL)")
	}
	if prefix == "" {
		return Topic{}, errors.New("topic has an empty prefix (want PREFIX@HOST[:PORT]@MODEL)")
	}
	t := Topic{Prefix: prefix, Model: model}
	host := pod
	if h, p, err := net.SplitHostPort(pod); err == nil {
		port, perr := strconv.Atoi(p)
		if perr != nil || port < 1 || port > 65535 || strconv.Itoa(port) != p {
			return Topic{}, fmt.Errorf("topic's port %q: want 1..65535", p)
		}
		host, t.Port = h, port
	} else if strings.HasPrefix(pod, "[") && strings.HasSuffix(pod, "]") {
		host = pod[1 : len(pod)-1]
	}
	if !hostname.Valid(host) {
		return Topic{}, fmt.Errorf("topic's host %q is neither an IP address nor a DNS name", host)
	}
	t.Host = strings.ToLower(host)
	return t, nil
}

// HostPort is the pod's address as the topic names it: HOST:PORT (an IPv6
// host bracketed), or HOST alone when the topic has no port.
func (t Topic) HostPort() string {
	if t.Port == 0 {
		if strings.Contains(t.Host, ":") {
			return "[" + t.Host + "]"
		}
		return t.Host
	}
	return net.JoinHostPort(t.Host, strconv.Itoa(t.Port))
}

// String renders the topic as ParseTopic reads it.
func (t Topic) String() string { return t.Prefix + "@" + t.HostPort() + "@" + t.Model }
