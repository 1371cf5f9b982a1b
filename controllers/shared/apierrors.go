package shared

import (
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// RefusedForGood says whether the API server refused an object for what it is (invalid, forbidden
// by policy or quota, too large), not for a passing condition (throttling, a timeout, no connection).
func RefusedForGood(err error) bool {
	return apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err) ||
		apierrors.IsRequestEntityTooLargeError(err)
}

// IgnoreGone drops the error of a delete or patch whose target is gone (not found) or changed
// since it was read (a conflict on its precondition): there is nothing left to do to it.
func IgnoreGone(err error) error {
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
}
