// A real OpenID Connect provider (panva's oidc-provider) on loopback, for
// Studio's sign-in tests. Its accounts are read from a JSON file at every
// sign-in, so a test can change a member's groups between two logins.
//
//   node provider.mjs PORT ACCOUNTS_JSON KEYS_JSON REDIRECT_URI LOGOUT_URI
//
// KEYS_JSON holds the private JWKs it signs with (a test can rotate them by
// starting it again). OIDC_SKEW_SECONDS moves its clock while it answers at
// its token endpoint only, to issue ID tokens already expired.
import { readFileSync } from 'node:fs';
import Provider from 'oidc-provider';

const [port, accountsFile, keysFile, redirectUri, logoutUri] = process.argv.slice(2);
const skew = Number(process.env.OIDC_SKEW_SECONDS || 0);
const realNow = Date.now.bind(Date);

const provider = new Provider(`http://127.0.0.1:${port}`, {
  clients: [{
    client_id: 'studio',
    client_secret: 'studio-test-secret',
    redirect_uris: [redirectUri],
    post_logout_redirect_uris: [logoutUri],
    response_types: ['code'],
    grant_types: ['authorization_code'],
    id_token_signed_response_alg: 'RS256',
  }],
  jwks: JSON.parse(readFileSync(keysFile, 'utf8')),
  pkce: { required: () => true },
  scopes: ['openid', 'email', 'profile', 'groups'],
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['name', 'preferred_username'],
    groups: ['groups'],
  },
  findAccount: async (ctx, id) => {
    const account = JSON.parse(readFileSync(accountsFile, 'utf8'))[id];
    if (!account) return undefined;
    return { accountId: id, claims: async () => ({ sub: id, ...account }) };
  },
  features: {
    devInteractions: { enabled: true },
    rpInitiatedLogout: { enabled: true },
  },
  cookies: { keys: ['studio-test-cookie-key'] },
});
provider.proxy = false;
if (skew) {
  provider.use(async (ctx, next) => {
    if (ctx.path === '/token') Date.now = () => realNow() + skew * 1000;
    try {
      await next();
    } finally {
      Date.now = realNow;
    }
  });
}
provider.listen(Number(port), '127.0.0.1', () => {
  console.log('ready');
});
