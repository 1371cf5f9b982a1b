package fsm

import (
	"regexp"
	"sync"

	"github.com/kmm-project/kmm/internal/kernel"
)

// maxCachedPatterns bounds the compiled-pattern cache: patterns come from Modules, so an
// administrator editing mappings over months cannot make it grow without end.
const maxCachedPatterns = 256

// patterns memoizes compiled regular expressions: a Module's kernel mapping is matched against
// every node's kernel, and compiling it each time was the largest part of the Module→NMC decision.
var patterns = struct {
	sync.Mutex
	compiled map[string]*regexp.Regexp
}{compiled: map[string]*regexp.Regexp{}}

// compilePattern is kernel.CompilePattern (bounded size and cost) with a cache. Compiled expressions are safe for concurrent use,
// and invalid patterns are not cached (they are rare and rejected at admission).
func compilePattern(pattern string) (*regexp.Regexp, error) {
	patterns.Lock()
	re, ok := patterns.compiled[pattern]
	patterns.Unlock()
	if ok {
		return re, nil
	}
	re, err := kernel.CompilePattern(pattern)
	if err != nil {
		return nil, err
	}
	patterns.Lock()
	defer patterns.Unlock()
	if len(patterns.compiled) >= maxCachedPatterns {
		clear(patterns.compiled)
	}
	patterns.compiled[pattern] = re
	return re, nil
}
