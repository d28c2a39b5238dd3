package peers

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	zmq "github.com/pebbe/zmq4"
)

// Key is the CURVE keypair the replicas of one deployment share
// (--peer-key-file). Each replica's PUB socket is a CURVE server with it,
// and each SUB socket a CURVE client with it that names it as the server's
// key; the PUB side admits only clients whose public key is this one (a
// ZAP handler, zap.go). So only a process that holds the secret key can
// publish to the mesh or read it: the handshake proves possession of the
// secret, and everything after it is encrypted.
type Key struct {
	// Public and Secret are Z85 text, 40 characters each.
	Public, Secret string
}

// The key file is text: blank lines and lines starting with # are
// ignored, and two lines give the keys,
//
//	public=<40 Z85 characters>
//	secret=<40 Z85 characters>
//
// `prefixrouter peer-keygen` writes one. public may be left out (it is
// derived from secret); when given, it must be secret's.
const keyFileHelp = "a file of public=Z85 and secret=Z85 lines, as `prefixrouter peer-keygen` writes"

// maxKeyFile bounds what is read of a key file: a few lines.
const maxKeyFile = 4096

// GenerateKey makes a new keypair.
func GenerateKey() (Key, error) {
	if !zmq.HasCurve() {
		return Key{}, errors.New("this libzmq has no CURVE support (built without libsodium)")
	}
	pub, sec, err := zmq.NewCurveKeypair()
	if err != nil {
		return Key{}, fmt.Errorf("generate a CURVE keypair: %w", err)
	}
	return Key{Public: pub, Secret: sec}, nil
}

// Format is k as a key file.
func (k Key) Format() []byte {
	return []byte("# prefixrouter peer key: the CURVE keypair every router replica of one deployment shares\n" +
		"# (--peer-key-file). Keep it secret: whoever holds it can read and steer the replicas' mesh.\n" +
		"public=" + k.Public + "\nsecret=" + k.Secret + "\n")
}

// LoadKey reads and checks a key file.
func LoadKey(path string) (Key, error) {
	f, err := os.Open(path)
	if err != nil {
		return Key{}, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxKeyFile+1))
	if err != nil {
		return Key{}, err
	}
	if len(b) > maxKeyFile {
		return Key{}, fmt.Errorf("longer than %d bytes: want %s", maxKeyFile, keyFileHelp)
	}
	return ParseKey(b)
}

// z85 is the Z85 alphabet.
const z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"

func isZ85Key(s string) bool {
	if len(s) != 40 {
		return false
	}
	for _, c := range []byte(s) {
		if strings.IndexByte(z85, c) < 0 {
			return false
		}
	}
	return true
}

// ParseKey reads a key file's contents.
func ParseKey(b []byte) (Key, error) {
	if !zmq.HasCurve() {
		return Key{}, errors.New("this libzmq has no CURVE support (built without libsodium)")
	}
	var k Key
	sc := bufio.NewScanner(bytes.NewReader(b))
	line := 0
	for sc.Scan() {
		line++
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		name, v, ok := strings.Cut(s, "=")
		name, v = strings.TrimSpace(name), strings.TrimSpace(v)
		var dst *string
		switch {
		case !ok:
		case name == "public":
			dst = &k.Public
		case name == "secret":
			dst = &k.Secret
		}
		if dst == nil {
			return Key{}, fmt.Errorf("line %d: want public=KEY or secret=KEY (%s)", line, keyFileHelp)
		}
		if *dst != "" {
			return Key{}, fmt.Errorf("line %d: %s given twice", line, name)
		}
		if !isZ85Key(v) {
			return Key{}, fmt.Errorf("line %d: %s is not a 40-character Z85 key", line, name)
		}
		*dst = v
	}
	if err := sc.Err(); err != nil {
		return Key{}, err
	}
	if k.Secret == "" {
		return Key{}, fmt.Errorf("no secret= line: want %s", keyFileHelp)
	}
	pub, err := zmq.AuthCurvePublic(k.Secret)
	if err != nil {
		return Key{}, fmt.Errorf("secret: %w", err)
	}
	if k.Public != "" && k.Public != pub {
		return Key{}, errors.New("public is not the secret key's public key: the two lines come from different keypairs")
	}
	k.Public = pub
	return k, nil
}
