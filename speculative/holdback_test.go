package speculative

import (
	"fmt"
	"testing"

	"github.com/prefixrouter/prefixrouter/kvindex"
)

func TestHoldbackOff(t *testing.T) {
	r := newRig(t, Config{})
	for i := range 100 {
		a := r.Assign(Conversation{Model: "m", SessionID: fmt.Sprint(i), Keys: keyRange(0, 5)})
		if a != (Assignment{Arm: ArmSpeculative, Basis: BasisOff}) {
			t.Fatalf("holdback off, yet %+v", a)
		}
	}
}

// TestHoldbackBySession: a named session or user keeps its arm, and the
// holdback's share of them is the configured fraction.
func TestHoldbackBySession(t *testing.T) {
	r := newRig(t, DefaultConfig())
	held := 0
	groups := map[Arm]map[uint8]bool{ArmSpeculative: {}, ArmHoldback: {}}
	const n = 10000
	for i := range n {
		c := Conversation{Model: "m", SessionID: fmt.Sprintf("session-%d", i), User: "the same user", Keys: keyRange(i*10, 5)}
		a := r.Assign(c)
		if a.Basis != BasisSession {
			t.Fatalf("basis %v, want session (it comes before the user)", a.Basis)
		}
		for turn := range 3 {
			c.Keys = keyRange(i*10, 6+turn)
			if b := r.Assign(c); b != a {
				t.Fatalf("session %d moved from %+v to %+v", i, a, b)
			}
		}
		if a.Arm == ArmHoldback {
			held++
		}
		groups[a.Arm][a.Group] = true
	}
	if share := float64(held) / n; share < 0.04 || share > 0.06 {
		t.Fatalf("holdback share %v of sessions, want 0.05", share)
	}
	// The holdback's 500 sessions spread over the variance groups as the
	// others do (about 63 of 64 groups expected).
	for arm, g := range groups {
		if len(g) < 56 {
			t.Errorf("%v arm: sessions in %d of %d variance groups", arm, len(g), NumGroups)
		}
	}
	u := r.Assign(Conversation{Model: "m", User: "alice"})
	if u.Basis != BasisUser || r.Assign(Conversation{Model: "other", User: "alice"}) != u {
		t.Fatalf("a user's arm: %+v", u)
	}
}

// conversationTurn is the keys of turn (from 1) of conversation c: the
// shared prefix, then the conversation's own blocks, three more a turn.
func conversationTurn(shared []kvindex.Key, c, turn int) []kvindex.Key {
	return append(append([]kvindex.Key(nil), shared...), keyRange(1_000_000+c*1000, 3*turn)...)
}

// assignTurns runs turns of n conversations, each turn of every
// conversation before the next turn, and returns each conversation's arms
// by turn.
func assignTurns(r *rig, n, turns int, prefix func(c int) []kvindex.Key) [][]Assignment {
	arms := make([][]Assignment, n)
	for turn := 1; turn <= turns; turn++ {
		for c := range n {
			arms[c] = append(arms[c], r.Assign(Conversation{Model: "m", RequestID: fmt.Sprintf("%d-%d", c, turn),
				Keys: conversationTurn(prefix(c), c, turn)}))
		}
	}
	return arms
}

// checkArms: every conversation keeps its turn-1 arm, by its prompt, but
// the first warmup ones: the first behind each shared prefix is placed by
// that prefix's first block before the prefix is known to be shared. The
// holdback holds its share of conversations.
func checkArms(t *testing.T, arms [][]Assignment, warmup int) {
	t.Helper()
	held := 0
	for c, byTurn := range arms {
		for turn, a := range byTurn {
			if a.Basis != BasisPrompt {
				t.Fatalf("conversation %d turn %d: basis %v, want prompt", c, turn+1, a.Basis)
			}
			if c >= warmup && a.Arm != byTurn[0].Arm {
				t.Fatalf("conversation %d moved arms at turn %d: %v", c, turn+1, byTurn)
			}
		}
		if byTurn[len(byTurn)-1].Arm == ArmHoldback {
			held++
		}
	}
	if share := float64(held) / float64(len(arms)); share < 0.03 || share > 0.07 {
		t.Fatalf("holdback share %v of %d conversations, want about 0.05", share, len(arms))
	}
}

// TestHoldbackSharedSystemPrompt: one system prompt in front of all
// traffic does not put every conversation in one arm, however long the
// prompt (170 blocks: 2,700 tokens of 16). The first conversations behind
// it are placed by block 0 while the record learns the prompt, each
// recording sharingAhead blocks further along it.
func TestHoldbackSharedSystemPrompt(t *testing.T) {
	for _, blocks := range []int{10, 170, 1000} {
		t.Run(fmt.Sprintf("%d blocks", blocks), func(t *testing.T) {
			system := keyRange(1, blocks)
			r := newRig(t, DefaultConfig())
			checkArms(t, assignTurns(r, 2000, 4, func(int) []kvindex.Key { return system }), blocks/sharingAhead+1)
		})
	}
	system := keyRange(1, 10)
	r := newRig(t, DefaultConfig())
	assignTurns(r, 3, 1, func(int) []kvindex.Key { return system })

	// A request whose keys, as the decision read them, end inside the
	// shared prompt has no block of its own: it is placed by itself, not
	// by the shared block 0.
	for _, keys := range [][]kvindex.Key{system, system[:6]} {
		if a := r.Assign(Conversation{Model: "m", RequestID: "short", Keys: keys}); a.Basis != BasisRequest {
			t.Fatalf("%d shared keys: basis %v, want request", len(keys), a.Basis)
		}
	}
}

// TestHoldbackTenantPrefixes: a fleet-wide system prompt followed by one
// of 20 tenants' few-shot prefixes: conversations are placed by their own
// blocks, not by their tenant's.
func TestHoldbackTenantPrefixes(t *testing.T) {
	system := keyRange(10_000_000, 100)
	tenant := func(c int) []kvindex.Key {
		return append(append([]kvindex.Key(nil), system...), keyRange(100+(c%20)*10, 5)...)
	}
	r := newRig(t, DefaultConfig())
	checkArms(t, assignTurns(r, 2000, 3, tenant), 20)
	if got := r.View().Holdback.Models[0].Assigned["prompt"]; got != 6000 {
		t.Fatalf("assigned by prompt %d, want 6,000", got)
	}
}

// TestHoldbackReplicasAgree: two routers seeing the same traffic put each
// conversation in the same arm.
func TestHoldbackReplicasAgree(t *testing.T) {
	system := keyRange(1, 10)
	a := assignTurns(newRig(t, DefaultConfig()), 300, 2, func(int) []kvindex.Key { return system })
	b := assignTurns(newRig(t, DefaultConfig()), 300, 2, func(int) []kvindex.Key { return system })
	for c := range a {
		if fmt.Sprint(a[c]) != fmt.Sprint(b[c]) {
			t.Fatalf("conversation %d: %v and %v", c, a[c], b[c])
		}
	}
}

// TestHoldbackRecordFullKeepsArms: more conversations than the record
// holds. When it fills it keeps the shared prompt, so a conversation
// whose own blocks were dropped keeps its arm on its next turn.
func TestHoldbackRecordFullKeepsArms(t *testing.T) {
	system := keyRange(1, 10)
	r := newRig(t, DefaultConfig())
	const conversations, own = 5000, 60 // 300,000 blocks: more than sharingMaxNodes
	turn := func(c, n int) []kvindex.Key {
		return append(append([]kvindex.Key(nil), system...), keyRange(1_000_000+c*1000, own+n)...)
	}
	first := make([]Assignment, conversations)
	for c := range conversations {
		first[c] = r.Assign(Conversation{Model: "m", Keys: turn(c, 0)})
	}
	if n := len(r.arms.model("m").sharing.nodes); n >= conversations*own {
		t.Fatalf("the record holds %d blocks: it never filled", n)
	}
	held := 0
	for c := range conversations {
		a := r.Assign(Conversation{Model: "m", Keys: turn(c, 1)})
		if c > 0 && (a.Arm != first[c].Arm || a.Basis != BasisPrompt) {
			t.Fatalf("conversation %d: turn 1 %+v, turn 2 %+v", c, first[c], a)
		}
		if a.Arm == ArmHoldback {
			held++
		}
	}
	if share := float64(held) / conversations; share < 0.03 || share > 0.07 {
		t.Fatalf("holdback share %v, want about 0.05", share)
	}
}
