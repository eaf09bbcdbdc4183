// Generates the SDK's WIT types (sdk/js/wit) from wit/plugin.wit with jco's type generator:
//   node sdk/js/gen-types.mjs <jco-transpile package dir> wit/plugin.wit sdk/js/wit
// (`jco guest-types` 1.35 can't read a WIT path: it has no preopens; the source is passed in.)
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';

const [transpile, witPath, outDir] = process.argv.slice(2);
const vendor = pathToFileURL(resolve(transpile, 'vendor/js-component-bindgen-component.js'));
const { generateTypes, $init } = await import(vendor.href);
await $init;
const files = generateTypes('eggtimer-plugin', {
  wit: { tag: 'source', val: readFileSync(witPath, 'utf8') },
  world: 'plugin',
  guest: true,
  features: { tag: 'list', val: [] },
  tlaCompat: false,
});
for (const [name, bytes] of files) {
  const p = join(outDir, name);
  mkdirSync(dirname(p), { recursive: true });
  writeFileSync(p, bytes);
}
