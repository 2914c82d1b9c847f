// The page's state, shared by the views.

export const page = {
  params: new URLSearchParams(window.location.search),
  /// Reloads the current view (`background`: keep what is shown meanwhile).
  reload: null,
  /// Counts loads, so that an older answer never overwrites a newer one.
  generation: 0,
  timer: null,
  /// What the confirmation dialog will do when confirmed.
  pending: null,
  /// The saga shown in the detail view.
  saga: null,
};
