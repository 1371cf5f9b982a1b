package image

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/qmuntal/stateless"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// State is the state of one (Module, image), as stored in its MIC status entry.
type State = kmmv1beta1.ImageMachineState

// The states, re-exported for readability of this package.
const (
	Checking     = kmmv1beta1.ImageChecking
	Present      = kmmv1beta1.ImagePresent
	Missing      = kmmv1beta1.ImageMissing
	Building     = kmmv1beta1.ImageBuilding
	Signing      = kmmv1beta1.ImageSigning
	BuildBackOff = kmmv1beta1.ImageBuildBackOff
	SignBackOff  = kmmv1beta1.ImageSignBackOff
)

// States lists every state, in the order the diagrams describe them.
var States = []State{Checking, Present, Missing, Building, Signing, BuildBackOff, SignBackOff}

// Trigger is an observed event that may move an image to another state.
type Trigger string

// The triggers. Step derives them from facts; the machine decides where each leads.
const (
	// ImageFound: the registry answered that the image exists.
	ImageFound Trigger = "ImageFound"
	// ImageNotFound: the registry answered that the image does not exist.
	ImageNotFound Trigger = "ImageNotFound"
	// BuildSucceeded: the current run's build pod finished successfully (it pushed its image).
	BuildSucceeded Trigger = "BuildSucceeded"
	// BuildFailed: the current run's build pod failed.
	BuildFailed Trigger = "BuildFailed"
	// SignSucceeded: the current run's sign pod finished successfully (it pushed the signed image).
	SignSucceeded Trigger = "SignSucceeded"
	// SignFailed: the current run's sign pod failed.
	SignFailed Trigger = "SignFailed"
	// BackOffExpired: the back-off after a failure is over.
	BackOffExpired Trigger = "BackOffExpired"
	// RebuildRequested: the Module's imageRebuildTriggerGeneration differs from the one the image
	// was last checked for.
	RebuildRequested Trigger = "RebuildRequested"
)

// AllTriggers lists every trigger, in the order Step tries them.
var AllTriggers = []Trigger{BuildSucceeded, BuildFailed, SignSucceeded, SignFailed, RebuildRequested,
	ImageFound, ImageNotFound, BackOffExpired}

// IsFailure says whether a trigger reports a failed attempt (it counts in attempts).
func IsFailure(t Trigger) bool { return t == BuildFailed || t == SignFailed }

// ErrNotPermitted is returned (wrapped) when a trigger is not permitted in the current state.
var ErrNotPermitted = errors.New("trigger not permitted")

// Guard is a condition on the facts of a Fire call; its function name appears in the diagrams.
type Guard func(ctx context.Context, args ...any) bool

// Edge is one permitted transition: in From, Trigger leads to To when Guard (if any) holds.
type Edge struct {
	From    State
	Trigger Trigger
	To      State
	Guard   Guard
}

// Edges is the machine: every permitted transition. Configure declares exactly these; a test can
// build a machine from an altered copy (a seeded fault) with NewMachine.
func Edges() []Edge {
	return []Edge{
		{Checking, ImageFound, Present, nil},
		{Checking, ImageNotFound, Building, buildWanted},
		{Checking, ImageNotFound, Signing, signOnly},
		{Checking, ImageNotFound, Missing, noRecipe},

		{Missing, ImageFound, Present, nil},
		{Missing, ImageNotFound, Building, buildWanted},
		{Missing, ImageNotFound, Signing, signOnly},
		{Missing, RebuildRequested, Checking, nil},

		{Present, RebuildRequested, Checking, nil},

		{Building, BuildSucceeded, Signing, signWanted},
		{Building, BuildSucceeded, Checking, noSignWanted},
		{Building, BuildFailed, BuildBackOff, nil},

		{Signing, SignSucceeded, Checking, nil},
		{Signing, SignFailed, SignBackOff, nil},

		{BuildBackOff, BackOffExpired, Checking, nil},
		{BuildBackOff, RebuildRequested, Checking, nil},

		// A failed sign is retried as a sign, never as a rebuild: the unsigned image is there
		// (upstream's loop after sign keys were patched rebuilt on every sign failure). Only a
		// recipe that no longer signs checks the image again.
		{SignBackOff, BackOffExpired, Signing, signWanted},
		{SignBackOff, BackOffExpired, Checking, noSignWanted},
		{SignBackOff, RebuildRequested, Checking, nil},
	}
}

// imageKey is the context key under which a Fire call carries its image.
type imageKey struct{}

// fireState is the external storage of one Fire call: the state and the facts the guards read.
type fireState struct {
	state State
	facts *Facts
}

func factsFrom(ctx context.Context) *Facts {
	return ctx.Value(imageKey{}).(*fireState).facts
}

var (
	machineOnce sync.Once
	machine     *Machine
)

// Machine is a configured image state machine.
type Machine struct {
	sm *stateless.StateMachine
}

// Default returns the machine of Edges, built once and shared: each Fire call carries its own
// state and facts in its context, so concurrent images never share state.
func Default() *Machine {
	machineOnce.Do(func() { machine = NewMachine(Edges()) })
	return machine
}

// NewMachine builds a machine from edges.
func NewMachine(edges []Edge) *Machine {
	sm := stateless.NewStateMachineWithExternalStorage(
		func(ctx context.Context) (stateless.State, error) {
			if s, ok := ctx.Value(imageKey{}).(*fireState); ok {
				return s.state, nil
			}
			return Checking, nil
		},
		func(ctx context.Context, s stateless.State) error {
			ctx.Value(imageKey{}).(*fireState).state = s.(State)
			return nil
		},
		stateless.FiringImmediate,
	)
	sm.OnUnhandledTrigger(func(_ context.Context, state stateless.State, trigger stateless.Trigger, unmet []string) error {
		return fmt.Errorf("%w: %s in state %s (unmet guards %v)", ErrNotPermitted, trigger, state, unmet)
	})
	Configure(sm, edges)
	return &Machine{sm: sm}
}

// Configure declares every state and the edges on sm. It is the single source of the machine: the
// controller, the tests and the diagram generator all use it.
func Configure(sm *stateless.StateMachine, edges []Edge) {
	for _, s := range States {
		sm.Configure(s)
	}
	for _, e := range edges {
		if e.Guard != nil {
			sm.Configure(e.From).Permit(e.Trigger, e.To, stateless.GuardFunc(e.Guard))
		} else {
			sm.Configure(e.From).Permit(e.Trigger, e.To)
		}
	}
}

// canFire says whether t is permitted (its guards hold) in state from with facts f.
func (m *Machine) canFire(from State, t Trigger, f *Facts) bool {
	ctx := context.WithValue(context.Background(), imageKey{}, &fireState{state: from, facts: f})
	ok, err := m.sm.CanFireCtx(ctx, t)
	return err == nil && ok
}

// fire fires t in state from with facts f and returns the state it leads to.
func (m *Machine) fire(from State, t Trigger, f *Facts) (State, error) {
	s := &fireState{state: from, facts: f}
	ctx := context.WithValue(context.Background(), imageKey{}, s)
	if err := m.sm.FireCtx(ctx, t); err != nil {
		return from, err
	}
	return s.state, nil
}

// Guards. They read the recipe of the Fire call's facts.

// buildWanted: the recipe builds the image.
func buildWanted(ctx context.Context, _ ...any) bool { return factsFrom(ctx).Recipe.Build }

// signOnly: the recipe signs a prebuilt unsigned image and builds nothing.
func signOnly(ctx context.Context, _ ...any) bool {
	r := factsFrom(ctx).Recipe
	return r.Sign && !r.Build
}

// noRecipe: nothing can make the image; it is waited for.
func noRecipe(ctx context.Context, _ ...any) bool {
	r := factsFrom(ctx).Recipe
	return !r.Sign && !r.Build
}

// signWanted: the built image is signed before it is used.
func signWanted(ctx context.Context, _ ...any) bool { return factsFrom(ctx).Recipe.Sign }

// noSignWanted: the built image is the image.
func noSignWanted(ctx context.Context, args ...any) bool { return !signWanted(ctx, args...) }
