package health

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// checkCacheConfigs compares the discovered cache configurations of each
// model's targets with each other and with the configured flags, sets every
// target's conflict text, and returns the per-model view.
//
// Block size and hash algorithm must agree: they decide every block key, so
// a pod that disagrees has an index the router cannot match. The reference
// is the flag when set, else the strict majority of the model's pods; with
// no strict majority every pod of the model is in conflict. The GPU block
// count legitimately differs between pods on different hardware and is
// reported, not judged.
func (m *Monitor) checkCacheConfigs(all []*rankState) map[string]ModelConfig {
	byModel := map[string][]*rankState{}
	for _, t := range all {
		t.conflict, t.conflictModels = "", nil
		if t.draining {
			continue
		}
		for _, mod := range t.models() {
			byModel[mod] = append(byModel[mod], t)
		}
	}
	conflicts := map[*rankState][]string{}
	out := make(map[string]ModelConfig, len(byModel))
	for mod, ts := range byModel {
		mc := ModelConfig{Model: mod, Targets: len(ts), Agreed: true}
		bs, bsWhy := reference(ts, m.cfg.BlockSize != 0, strconv.Itoa(m.cfg.BlockSize), "--block-size",
			func(c CacheConfig) string {
				if c.BlockSize == 0 {
					return ""
				}
				return strconv.Itoa(c.BlockSize)
			})
		algo, algoWhy := reference(ts, m.cfg.HashAlgo != "", m.cfg.HashAlgo, "--hash-algo",
			func(c CacheConfig) string { return c.HashAlgo })
		if bs != "" {
			mc.BlockSize, _ = strconv.Atoi(bs)
		}
		mc.HashAlgo = algo
		for _, t := range ts {
			if !t.cache.Known {
				continue
			}
			check := func(field, have, want, why string) {
				if have == "" {
					return
				}
				if want == "" {
					msg := fmt.Sprintf("model %s: %s %s on %s, pods disagree with no majority", mod, field, have, t.ts.ID.String())
					conflicts[t] = append(conflicts[t], msg)
					mc.Conflicts = append(mc.Conflicts, msg)
					addModel(t, mod)
					return
				}
				if have != want {
					msg := fmt.Sprintf("model %s: %s %s on %s, expected %s (%s)", mod, field, have, t.ts.ID.String(), want, why)
					conflicts[t] = append(conflicts[t], msg)
					mc.Conflicts = append(mc.Conflicts, msg)
					addModel(t, mod)
				}
			}
			bsHave := ""
			if t.cache.BlockSize != 0 {
				bsHave = strconv.Itoa(t.cache.BlockSize)
			}
			check("block_size", bsHave, bs, bsWhy)
			check("prefix_caching_hash_algo", t.cache.HashAlgo, algo, algoWhy)
		}
		slices.Sort(mc.Conflicts)
		mc.Agreed = len(mc.Conflicts) == 0
		out[mod] = mc
	}
	for t, c := range conflicts {
		slices.Sort(c)
		t.conflict = strings.Join(slices.Compact(c), "; ")
	}
	return out
}

func addModel(t *rankState, mod string) {
	if !slices.Contains(t.conflictModels, mod) {
		t.conflictModels = append(t.conflictModels, mod)
	}
}

// reference picks the value the pods of one model should have: the flag
// when set, else the strict majority of the known values ("" when there is
// none, or when nothing is known).
func reference(ts []*rankState, flagSet bool, flag, flagName string, field func(CacheConfig) string) (string, string) {
	if flagSet {
		return flag, "flag " + flagName
	}
	counts := map[string]int{}
	known := 0
	for _, t := range ts {
		if !t.cache.Known {
			continue
		}
		if v := field(t.cache); v != "" {
			counts[v]++
			known++
		}
	}
	if len(counts) == 1 {
		for v := range counts {
			return v, "all pods"
		}
	}
	for v, n := range counts {
		if 2*n > known {
			return v, fmt.Sprintf("%d of %d pods", n, known)
		}
	}
	return "", ""
}
