package conversation

import (
	"fmt"
	"strconv"
	"strings"
)

// A Breakdown lives in the conversation's Redis hash as members of groups,
// which the batch script folds without knowing what they mean (see
// batchScript): for a member N of group G, "m|G|N" marks it present,
// "g|G|N|C" holds its counter C, "a|G|N|A" its attribute A (set by the
// first batch that has it), and "n|G" counts G's members. A member past its
// group's cap is folded into Overflow.

// The groups and their counters, in the order a batch sends them.
const (
	groupClass      = "c"
	groupAgent      = "a"
	groupTool       = "t"
	groupCompaction = "k"
	groupPrompt     = "p"
)

// appendBreakdown appends bd's member operations to a batch's arguments:
// their count, then for each its group, name, cap, counters (count, then
// name and delta each) and attributes (count, then name and value each).
func appendBreakdown(args []any, bd *Breakdown) []any {
	n := len(bd.Classes) + len(bd.Agents) + len(bd.Tools) + len(bd.Compactions) + len(bd.prompts)
	if bd.PromptsCapped {
		n++
	}
	args = append(args, n)
	calls := func(c *Calls) []any {
		return []any{5, "n", c.Calls, "e", c.Errors, "c", c.CostMicros, "te", c.E2EMicros, "tt", c.TTFTMicros}
	}
	for name, c := range bd.Classes {
		args = append(args, groupClass, name, MaxClasses)
		args = append(args, calls(c)...)
		args = append(args, 0)
	}
	for name, a := range bd.Agents {
		args = append(args, groupAgent, name, MaxAgents)
		args = append(args, calls(&a.Calls)...)
		args = append(args, 2, "p", a.Parent, "y", a.Type)
	}
	for name, t := range bd.Tools {
		args = append(args, groupTool, name, MaxTools, 2, "r", t.Runs, "ms", t.Millis, 0)
	}
	for name, c := range bd.Compactions {
		args = append(args, groupCompaction, name, MaxCompactionKinds,
			4, "n", c.Calls, "tb", c.TokensBefore, "a", c.After, "ta", c.TokensAfter, 0)
	}
	for p := range bd.prompts {
		args = append(args, groupPrompt, p, MaxPrompts, 0, 0)
	}
	if bd.PromptsCapped {
		args = append(args, groupPrompt, Overflow, MaxPrompts, 0, 0)
	}
	return args
}

// parseBreakdownField reads one of a Breakdown's hash fields into c,
// reporting whether name is one.
func parseBreakdownField(c *Conversation, name, val string) (bool, error) {
	kind, rest, ok := strings.Cut(name, "|")
	if !ok {
		return false, nil
	}
	bd := &c.Breakdown
	switch kind {
	case "n":
		if rest == groupPrompt {
			n, err := strconv.ParseInt(val, 10, 64)
			bd.Prompts = n
			return true, err
		}
		return true, nil
	case "m":
		if rest == groupPrompt+"|"+Overflow {
			bd.PromptsCapped = true
		}
		return true, nil
	case "g", "a":
	default:
		return false, nil
	}
	// rest is G|N|C: N has no '|' (cleanName).
	group, rest, ok1 := strings.Cut(rest, "|")
	i := strings.LastIndexByte(rest, '|')
	if !ok1 || i < 0 {
		return true, fmt.Errorf("malformed breakdown field %q", name)
	}
	member, field := rest[:i], rest[i+1:]
	if kind == "a" {
		if group == groupAgent {
			a := member0(&bd.Agents, member)
			switch field {
			case "p":
				a.Parent = val
			case "y":
				a.Type = val
			}
		}
		return true, nil
	}
	n, err := strconv.ParseInt(val, 10, 64)
	if err != nil {
		return true, fmt.Errorf("breakdown field %q: %w", name, err)
	}
	switch group {
	case groupClass:
		setCalls(member0(&bd.Classes, member), field, n)
	case groupAgent:
		setCalls(&member0(&bd.Agents, member).Calls, field, n)
	case groupTool:
		t := member0(&bd.Tools, member)
		switch field {
		case "r":
			t.Runs = n
		case "ms":
			t.Millis = n
		}
	case groupCompaction:
		k := member0(&bd.Compactions, member)
		switch field {
		case "n":
			k.Calls = n
		case "tb":
			k.TokensBefore = n
		case "a":
			k.After = n
		case "ta":
			k.TokensAfter = n
		}
	}
	return true, nil
}

func setCalls(c *Calls, field string, n int64) {
	switch field {
	case "n":
		c.Calls = n
	case "e":
		c.Errors = n
	case "c":
		c.CostMicros = n
	case "te":
		c.E2EMicros = n
	case "tt":
		c.TTFTMicros = n
	}
}

// member0 is member without a cap: what Redis holds was capped there.
func member0[T any](m *map[string]*T, name string) *T {
	if *m == nil {
		*m = make(map[string]*T)
	}
	v, ok := (*m)[name]
	if !ok {
		v = new(T)
		(*m)[name] = v
	}
	return v
}
