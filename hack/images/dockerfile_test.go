package main

import (
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// The Dockerfile check reads just what the repository's Dockerfile uses: FROM … AS, COPY (with
// --from), ENV, USER and ENTRYPOINT in JSON form; RUN only matters for which stage reads
// worker-files.txt.

// listFile is the path, in the build context, of the list the Dockerfile's rootfs stage copies.
const listFile = "hack/images/worker-files.txt"

type dockerCopy struct {
	From string
	Srcs []string
	Dest string
}

type dockerStage struct {
	Name       string
	From       string
	Copies     []dockerCopy
	Env        []string
	User       string
	Entrypoint []string
}

// logicalLines returns the Dockerfile's instructions, continuation lines joined, comments dropped.
func logicalLines(text string) []string {
	var logical []string
	var b strings.Builder
	for _, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && b.Len() == 0) {
			continue
		}
		if strings.HasSuffix(trimmed, "\\") {
			b.WriteString(strings.TrimSuffix(trimmed, "\\") + " ")
			continue
		}
		b.WriteString(trimmed)
		logical = append(logical, b.String())
		b.Reset()
	}
	return logical
}

// parseDockerfile returns the stages by name.
func parseDockerfile(text string) (map[string]*dockerStage, error) {
	stages := map[string]*dockerStage{}
	var cur *dockerStage
	for _, l := range logicalLines(text) {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		op, args := strings.ToUpper(f[0]), f[1:]
		if op == "FROM" {
			args = dropFlags(args)
			if len(args) == 0 {
				return nil, fmt.Errorf("FROM without an image: %q", l)
			}
			cur = &dockerStage{From: args[0]}
			if len(args) == 3 && strings.EqualFold(args[1], "AS") {
				cur.Name = args[2]
				stages[cur.Name] = cur
			}
			continue
		}
		if cur == nil {
			if op == "ARG" {
				continue
			}
			return nil, fmt.Errorf("%s before FROM", op)
		}
		switch op {
		case "COPY", "ADD":
			c := dockerCopy{}
			var rest []string
			for _, a := range args {
				if v, ok := strings.CutPrefix(a, "--from="); ok {
					c.From = v
				} else if !strings.HasPrefix(a, "--") {
					rest = append(rest, a)
				}
			}
			if len(rest) < 2 {
				return nil, fmt.Errorf("%s needs a source and a destination: %q", op, l)
			}
			c.Srcs, c.Dest = rest[:len(rest)-1], rest[len(rest)-1]
			cur.Copies = append(cur.Copies, c)
		case "ENV":
			cur.Env = append(cur.Env, args...)
		case "USER":
			cur.User = strings.Join(args, " ")
		case "ENTRYPOINT":
			cur.Entrypoint = nil
			if err := json.Unmarshal([]byte(strings.Join(args, " ")), &cur.Entrypoint); err != nil {
				return nil, fmt.Errorf("ENTRYPOINT in JSON form expected: %q", l)
			}
		}
	}
	return stages, nil
}

func dropFlags(args []string) []string {
	var out []string
	for _, a := range args {
		if !strings.HasPrefix(a, "--") {
			out = append(out, a)
		}
	}
	return out
}

// readsList reports whether a stage builds its /rootfs/ from worker-files.txt.
func (s *dockerStage) readsList() bool {
	for _, c := range s.Copies {
		if c.From == "" && slices.Contains(c.Srcs, listFile) {
			return true
		}
	}
	return false
}

// compareDockerfile checks the Dockerfile's stage for p against the builder's image img and its
// non-directory files: the files its COPYs put there (a COPY of a list stage's /rootfs/ stands for
// the list's entries for the architecture), the environment, user and entrypoint.
func compareDockerfile(dockerfile string, list workerList, stage string, p platform, img v1.Image, files []string) []string {
	stages, err := parseDockerfile(dockerfile)
	if err != nil {
		return []string{err.Error()}
	}
	st := stages[stage]
	if st == nil {
		return []string{"no stage " + stage}
	}
	var problems []string
	if st.From != "scratch" {
		problems = append(problems, "FROM "+st.From+", want scratch: nothing but the copied files")
	}
	var patterns []string
	for _, c := range st.Copies {
		from := stages[c.From]
		switch {
		case len(c.Srcs) == 1 && c.Srcs[0] == "/rootfs/":
			if from == nil || !from.readsList() || c.Dest != "/" {
				problems = append(problems, fmt.Sprintf("COPY --from=%s /rootfs/ %s: want a copy to / of a stage that builds its /rootfs/ from %s", c.From, c.Dest, listFile))
				continue
			}
			patterns = append(patterns, list.forArch(p.GOARCH)...)
		case len(c.Srcs) == 1 && !strings.HasSuffix(c.Srcs[0], "/"):
			dest := c.Dest
			if strings.HasSuffix(dest, "/") {
				dest += path.Base(c.Srcs[0])
			}
			patterns = append(patterns, dest)
		default:
			problems = append(problems, fmt.Sprintf("COPY %v %s: the check reads single files and list stages' /rootfs/ only", c.Srcs, c.Dest))
		}
	}
	problems = append(problems, matchFiles(patterns, files)...)
	cf, err := img.ConfigFile()
	if err != nil {
		return append(problems, err.Error())
	}
	if st.User != cf.Config.User {
		problems = append(problems, fmt.Sprintf("USER %q, the builder's image runs as %q", st.User, cf.Config.User))
	}
	if !slices.Equal(st.Entrypoint, cf.Config.Entrypoint) {
		problems = append(problems, fmt.Sprintf("ENTRYPOINT %q, the builder's %q", st.Entrypoint, cf.Config.Entrypoint))
	}
	if !slices.Equal(st.Env, cf.Config.Env) {
		problems = append(problems, fmt.Sprintf("ENV %q, the builder's %q", st.Env, cf.Config.Env))
	}
	return problems
}

// rootfsScript returns the RUN instruction of the stage that reads the list and fills /rootfs.
func rootfsScript(dockerfile string) (string, error) {
	for _, l := range logicalLines(dockerfile) {
		if script, ok := strings.CutPrefix(l, "RUN "); ok && strings.Contains(script, "/tmp/worker-files.txt") && strings.Contains(script, "/rootfs") {
			return script, nil
		}
	}
	return "", fmt.Errorf("no RUN instruction reads /tmp/worker-files.txt into /rootfs")
}
