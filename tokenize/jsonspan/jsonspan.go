// Package jsonspan owns finding where a JSON value ends in raw bytes
// without decoding or validating it: the one value skipper the router (to
// read fields back from a body it has already checked) and the chat
// renderer (to split a messages array into elements it caches) share.
package jsonspan

import "bytes"

// SkipWS returns the index of the first byte at or after i that is not
// JSON white space (or len(b)).
func SkipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// End returns the index just past the value starting at b[i]: past the
// closing quote of a string, the matching close of an object or array, or
// a scalar's last byte before a delimiter (',', ']', '}', white space or
// the end of b). Brackets are counted, not matched by kind, and scalars are
// not checked: on invalid JSON the extent may be wrong, so a caller either
// knows b is valid or validates the value it gets. ok is false when the
// value is unterminated or b[i] cannot start one.
func End(b []byte, i int) (end int, ok bool) {
	if i >= len(b) {
		return i, false
	}
	switch b[i] {
	case '"':
		return strEnd(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				end, ok := strEnd(b, i)
				if !ok {
					return end, false
				}
				i = end
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1, true
				}
			}
			i++
		}
		return i, false
	case ',', ']', '}', ':':
		return i, false
	}
	for j := i; j < len(b); j++ {
		switch b[j] {
		case ',', ']', '}', ' ', '\t', '\n', '\r':
			return j, true
		}
	}
	return len(b), true
}

// strEnd returns the index just past the string starting at b[i] (a
// quote): the first quote not escaped by an odd run of backslashes. Message
// texts are most of a chat request, so it jumps quote to quote.
func strEnd(b []byte, i int) (int, bool) {
	j := i + 1
	for {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return len(b), false
		}
		q := j + k
		n := 0
		for p := q - 1; p > i && b[p] == '\\'; p-- {
			n++
		}
		if n%2 == 0 {
			return q + 1, true
		}
		j = q + 1
	}
}
