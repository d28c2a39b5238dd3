package tokenize

import (
	"crypto/sha256"
	"os"
	"sync"
	"testing"

	"github.com/prefixrouter/prefixrouter/tokenize/bpe"
)

// TestMain has the package's tests parse each tokenizer.json once: a parse
// takes seconds under -race, and the tests load the same few models again
// and again, from testdata and from hub caches in temporary directories, so
// a file is known by its content. Every load gets a copy of its own, since a
// model's setup (SetCache, SetSpecialTokens) sets the copy's fields; the
// parsed tables it shares are read-only, as they are between requests.
func TestMain(m *testing.M) {
	parse := loadBPE
	var mu sync.Mutex
	parsed := map[[sha256.Size]byte]*bpe.Tokenizer{}
	loadBPE = func(path string) (*bpe.Tokenizer, error) {
		data, err := os.ReadFile(path)
		if err != nil {
			return parse(path)
		}
		key := sha256.Sum256(data)
		mu.Lock()
		defer mu.Unlock()
		t := parsed[key]
		if t == nil {
			if t, err = parse(path); err != nil {
				return nil, err
			}
			parsed[key] = t
		}
		c := *t
		return &c, nil
	}
	os.Exit(m.Run())
}
