// `node --import @eggtimer/sdk/register --test`: resolves the host interface
// `eggtimer:plugin/host@0.1.0` to the SDK's test host, so a handler runs in plain Node.
import { register } from 'node:module';

register('./hooks.js', import.meta.url);
