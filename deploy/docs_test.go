package deploy_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// readmeMaxLines is the most lines README.md may have: it is where a
// newcomer starts, and the reference lives in docs/.
const readmeMaxLines = 260

// markdownFiles returns the Markdown files whose links are checked, relative
// to the module root: the top-level guides and every page in docs/.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	files := []string{"README.md", "CONTRIBUTING.md", "ARCHITECTURE.md"}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) == 0 {
		t.Fatal("docs/ holds no .md page")
	}
	for _, d := range docs {
		rel, err := filepath.Rel(root, d)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, filepath.ToSlash(rel))
	}
	return files
}

var (
	fenceRE   = regexp.MustCompile("^\\s*(```|~~~)")
	codeRE    = regexp.MustCompile("`+[^`]*`+")
	linkRE    = regexp.MustCompile(`\[[^\]]*\]\(([^()\s]+)(?:\s+"[^"]*")?\)`)
	headingRE = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	inlineRE  = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
)

// proseLines returns doc's lines with fenced code blocks blanked, so that
// what looks like a link or a heading inside code is not taken for one.
func proseLines(doc string) []string {
	lines := strings.Split(doc, "\n")
	in := false
	for i, l := range lines {
		if fenceRE.MatchString(l) {
			in = !in
			lines[i] = ""
			continue
		}
		if in {
			lines[i] = ""
		}
	}
	return lines
}

// mdLink is one Markdown link found in a file.
type mdLink struct {
	line   int
	target string
}

// relativeLinks returns the links of doc that point into the repository:
// neither http(s) nor mailto, and outside inline code.
func relativeLinks(doc string) []mdLink {
	var out []mdLink
	for i, l := range proseLines(doc) {
		for _, m := range linkRE.FindAllStringSubmatch(codeRE.ReplaceAllString(l, ""), -1) {
			target := m[1]
			lower := strings.ToLower(target)
			if strings.HasPrefix(lower, "http://") || strings.HasPrefix(lower, "https://") || strings.HasPrefix(lower, "mailto:") {
				continue // no internet here: external links are not fetched
			}
			out = append(out, mdLink{line: i + 1, target: target})
		}
	}
	return out
}

// slug is GitHub's anchor for a heading's text: links reduced to their
// text, lower case, every character but letters, digits, spaces, '-' and
// '_' dropped, and each space turned into '-'.
func slug(heading string) string {
	heading = inlineRE.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// anchors returns the anchors of doc's headings, a repeated one numbered as
// GitHub does ("x", "x-1", "x-2").
func anchors(doc string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, l := range proseLines(doc) {
		m := headingRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		s := slug(m[1])
		if n := seen[s]; n > 0 {
			out[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

func TestSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"Run the tests":                                   "run-the-tests",
		"Live figures: `/stats`":                          "live-figures-stats",
		"Other `/v1/*` paths":                             "other-v1-paths",
		"Side by side with nginx: `make bench-compare`":   "side-by-side-with-nginx-make-bench-compare",
		"Traces (OpenTelemetry)":                          "traces-opentelemetry",
		"Keys, teams, limits and budgets":                 "keys-teams-limits-and-budgets",
		"What `/stats` costs":                             "what-stats-costs",
		"Stored state belongs to the team that made it":   "stored-state-belongs-to-the-team-that-made-it",
		"The [dashboard](bench.md#dashboard) and its_use": "the-dashboard-and-its_use",
	} {
		if got := slug(heading); got != want {
			t.Errorf("slug(%q) = %q, want %q", heading, got, want)
		}
	}
	if got := anchors("# A\n## B\n```\n## C\n```\n## B\n### B\n"); !reflectKeys(got, "a", "b", "b-1", "b-2") {
		t.Errorf("anchors: %v, want a, b, b-1, b-2 (none for the heading in code)", got)
	}
}

func reflectKeys(m map[string]bool, want ...string) bool {
	var got []string
	for k := range m {
		got = append(got, k)
	}
	slices.Sort(got)
	slices.Sort(want)
	return slices.Equal(got, want)
}

// TestDocsLinks: every relative link in README.md, CONTRIBUTING.md,
// ARCHITECTURE.md and docs/*.md names a file or directory of the
// repository, and a link with an anchor names a heading of its target (or
// of the same file, for "#anchor" alone). External links are not fetched.
func TestDocsLinks(t *testing.T) {
	root := repoRoot(t)
	anchorsOf := map[string]map[string]bool{}
	fileAnchors := func(path string) (map[string]bool, error) {
		if a, ok := anchorsOf[path]; ok {
			return a, nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		anchorsOf[path] = anchors(string(b))
		return anchorsOf[path], nil
	}
	checked := 0
	for _, name := range markdownFiles(t, root) {
		file := filepath.Join(root, filepath.FromSlash(name))
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range relativeLinks(string(b)) {
			checked++
			path, anchor, _ := strings.Cut(l.target, "#")
			target := file
			if path != "" {
				target = filepath.Join(filepath.Dir(file), filepath.FromSlash(path))
				if _, err := os.Stat(target); err != nil {
					t.Errorf("%s:%d: link %q: %s does not exist", name, l.line, l.target, path)
					continue
				}
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(target, ".md") {
				t.Errorf("%s:%d: link %q: an anchor into %s, which is not Markdown", name, l.line, l.target, path)
				continue
			}
			a, err := fileAnchors(target)
			if err != nil {
				t.Errorf("%s:%d: link %q: %v", name, l.line, l.target, err)
				continue
			}
			if !a[anchor] {
				t.Errorf("%s:%d: link %q: no heading of %s has the anchor #%s", name, l.line, l.target, filepath.Base(target), anchor)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative link found: the link pattern is broken")
	}
}

// TestDocsIndexListsEveryPage: docs/README.md links every page in docs/,
// so none is reachable only by knowing its name.
func TestDocsIndexListsEveryPage(t *testing.T) {
	root := repoRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "docs", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	linked := map[string]bool{}
	for _, l := range relativeLinks(string(b)) {
		path, _, _ := strings.Cut(l.target, "#")
		linked[path] = true
	}
	entries, err := os.ReadDir(filepath.Join(root, "docs"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() || e.Name() == "README.md" {
			continue
		}
		if !linked[e.Name()] {
			t.Errorf("docs/README.md does not link docs/%s", e.Name())
		}
	}
}

// TestReadmeIsShort: README.md stays a page a newcomer reads to the end;
// the reference goes in docs/.
func TestReadmeIsShort(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n > readmeMaxLines {
		t.Errorf("README.md has %d lines, more than %d: move reference text to docs/", n, readmeMaxLines)
	}
}
