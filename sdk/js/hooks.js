// Module resolution hook (see register.js): the WIT host interface → the test host.
const HOST = 'eggtimer:plugin/host@0.1.0';

export async function resolve(specifier, context, next) {
  if (specifier === HOST) {
    return { url: new URL('./test-host.js', import.meta.url).href, shortCircuit: true };
  }
  return next(specifier, context);
}
